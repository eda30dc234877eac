# Grain's "Reading from AWS S3" tutorial, its Python code in order, copied from
# docs/tutorials/data_sources/load_from_s3_tutorial.md in google/grain (the jupytext twin
# of load_from_s3_tutorial.ipynb):
# https://github.com/google/grain/blob/859f62abe2457a402c510d8005a6a3570c67976c/docs/tutorials/data_sources/load_from_s3_tutorial.md
#
# Copyright Google LLC (the Grain authors).
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Grain's code as it documents it (two-space indents and all), so this project's
# formatter, linter and type checker leave it alone:
# ruff: noqa
# mypy: ignore-errors
#
# Edits, and only these:
# - `import grain` -> `import chute as grain`.
# - The shell cells that install Mountpoint for Amazon S3, configure AWS credentials,
#   mount the bucket and install packages (IPython `!` magics) removed.
# - The bucket mounted at /path/to/mount/files (no network here) replaced by a local
#   stand-in, the working directory: "/path/to/mount/files/data.array_record" ->
#   "./data.array_record", twice.
# fmt: off

from array_record.python import array_record_module

digits = [b"1", b"2", b"3", b"4", b"5"]

writer = array_record_module.ArrayRecordWriter("./data.array_record")
for i in digits:
  writer.write(i)
writer.close()

import chute as grain
from pprint import pprint

source =  grain.sources.ArrayRecordDataSource(paths="./data.array_record")

dataset = (
    grain.MapDataset.source(source)
    .shuffle(seed=10)  # Shuffles globally.
    .batch(batch_size=2)  # Batches consecutive elements.
)

pprint(list(dataset))
