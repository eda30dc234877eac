# Grain's "`Dataset` basics" tutorial, its code cells in order, copied from
# docs/tutorials/dataset_basic_tutorial.md in google/grain (the jupytext twin of
# dataset_basic_tutorial.ipynb), at the version written for grain 0.2.x:
# https://github.com/google/grain/blob/cbbbda293c6715d0e8709baa70e135fa84f65c4f/docs/tutorials/dataset_basic_tutorial.md
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
# - `import grain.python as grain` -> `import chute.python as grain`.
# - The `!pip install grain` cell (an IPython magic) removed.
# fmt: off

import chute.python as grain
import pprint

dataset = (
    # You can also use a shortcut grain.MapDataset.range for
    # range-like input.
    grain.MapDataset.source([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    .shuffle(seed=10)  # Shuffles globally.
    .map(lambda x: x+1)  # Maps each element.
    .batch(batch_size=2)  # Batches consecutive elements.
)

pprint.pprint(dataset[0])
pprint.pprint(list(dataset))

# Note: Inheriting `grain.RandomAccessDataSource` is optional but recommended.
class MySource(grain.RandomAccessDataSource):
  def __init__(self):
    self._data = [0, 1, 2, 3, 4, 5, 6, 7]

  def __getitem__(self, idx):
    return self._data[idx]

  def __len__(self):
    return len(self._data)

source = MySource()

dataset = (
    grain.MapDataset.source(source)
    .shuffle(seed=10)  # Shuffles globally.
    .map(lambda x: x+1)  # Maps each element.
    .batch(batch_size=2)  # Batches consecutive elements.
)

pprint.pprint(dataset[0])
pprint.pprint(list(dataset))

# Prints the 3rd element of the second epoch.
pprint.pprint(dataset[len(dataset)+2])

pprint.pprint(dataset[len(dataset)+2] == dataset[2])

filtered_dataset = dataset.filter(lambda e: (e[0] + e[1]) % 2 == 0)

pprint.pprint(f"Length of this dataset: {len(filtered_dataset)}")
pprint.pprint([filtered_dataset[i] for i in range(len(filtered_dataset))])

shard_index = 0
shard_count = 2

sharded_dataset = dataset[shard_index::shard_count]
print(f"Sharded dataset length = {len(sharded_dataset)}")
pprint.pprint(sharded_dataset[0])
pprint.pprint(sharded_dataset[1])

iter_dataset = sharded_dataset.to_iter_dataset(grain.ReadOptions(num_threads=16, prefetch_buffer_size=500))

for element in iter_dataset:
  pprint.pprint(element)

dataset_iter = iter(dataset)
pprint.pprint(isinstance(dataset_iter, grain.DatasetIterator))

pprint.pprint(next(dataset_iter))

checkpoint = dataset_iter.get_state()

pprint.pprint(next(dataset_iter))

# Recover the iterator to the state after the first produced element.
dataset_iter.set_state(checkpoint)

pprint.pprint(next(dataset_iter))  # This should generate the same element as above
