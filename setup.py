"""Builds chute's optional C extension; everything else is in pyproject.toml.

`chute._native` (src/chute/_native.c) computes CRC32C with the CPU's CRC32 instruction.
It is optional: without a C compiler the build of it fails with a warning, the install
succeeds, and chute uses the `crc32c` package instead (chute/_src/storage/records/checksum.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("chute._native", ["src/chute/_native.c"], optional=True)])
