"""glibc's allocator in the processes that compute elements (`chute._src.exec.mp.heap`): freed
blocks are reused, not given back to the kernel and faulted in again.

Each case runs in a fresh interpreter, whose allocator has seen nothing yet, and counts the
page faults of allocating, filling and freeing blocks of 1 to 8 MiB in turn (as a stage
that decodes pictures of growing sizes does). Untuned, glibc maps each block afresh, being
larger than any freed before: 36 MiB of faults. Reused, the heap grows to 8 MiB once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chute._src.exec.mp import heap
from process_helpers import run_main

pytestmark = pytest.mark.skipif(
    heap.glibc() is None, reason="chute tunes the allocator only where the C library is glibc"
)

PROBE = """
import ctypes
import resource

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


def faults_of_growing_blocks():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for mib in range(1, 9):
        block = libc.malloc(mib << 20)
        libc.memset(block, 1, mib << 20)
        libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""

PAGES_OF_36_MIB = 36 * 256


def faults(tmp_path: Path, setup: str) -> int:
    done = run_main(tmp_path, PROBE + setup + "\nprint(faults_of_growing_blocks())\n")
    return int(done.stdout.split()[-1])


def test_untuned_glibc_faults_every_block_in(tmp_path: Path) -> None:
    # What the other cases improve on (and a check that the probe measures it).
    assert faults(tmp_path, "") > 0.9 * PAGES_OF_36_MIB


def test_keep_freed_memory_makes_freed_blocks_reused(tmp_path: Path) -> None:
    setup = "from chute._src.exec.mp import heap\nheap.keep_freed_memory()\n"
    assert faults(tmp_path, setup) < 0.4 * PAGES_OF_36_MIB


def test_the_users_process_allocator_is_left_as_found(tmp_path: Path) -> None:
    # chute's workers tune their allocator; the process that iterates does not: after a
    # run with a worker, its freed blocks behave as in an untuned interpreter.
    setup = """
import chute

ds = chute.MapDataset.range(8).map(abs).to_iter_dataset()
it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1)))
assert next(it) == 0
it.close()
"""
    assert faults(tmp_path, setup) > 0.9 * PAGES_OF_36_MIB
