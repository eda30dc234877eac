# Grain's "`DataLoader` guide" tutorial, its code cells in order, copied from
# docs/tutorials/data_loader_tutorial.md in google/grain (the jupytext twin of
# data_loader_tutorial.ipynb):
# https://github.com/google/grain/blob/d435b94ab3c489c734bdccee7dfee71cc34f7c00/docs/tutorials/data_loader_tutorial.md
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
# - `!pip install ...`, `!rm -rf /tmp/orbax`, `!ls -R /tmp/orbax` and
#   `!cat /tmp/orbax/*/*/*.json` (IPython magics) removed.
# - TFDS data (no network here) replaced by a local stand-in of the same shape, built in
#   this file: `import tensorflow_datasets as tfds` -> the `ImagenetATest` class below,
#   `tfds.data_source("imagenet_a", split="test")` -> `ImagenetATest()`.
# - `ocp.CheckpointManager("/tmp/orbax")` -> `ocp.CheckpointManager(tempfile.mkdtemp())`
#   (and `import tempfile`): the tutorial empties /tmp/orbax with a magic before saving;
#   a fresh directory does that without colliding with other runs.
# fmt: off

import cv2
import orbax.checkpoint as ocp
import chute.python as grain
import matplotlib.pyplot as plt
import numpy as np

import os
os.environ.pop('TFDS_DATA_DIR', None)


# Stand-in for TFDS's "imagenet_a" test split: 7,500 records {"file_name": bytes,
# "image": uint8 (height, width, 3) of varying size, "label": int64 of 1,000 classes},
# made from the record's index.
class ImagenetATest:

  def __len__(self):
    return 7500

  def __getitem__(self, record_key):
    rng = np.random.default_rng(record_key)
    height, width = rng.integers(200, 400, 2)
    label = rng.integers(1000)
    return {
        "file_name": f"{record_key:06d}_class_{label}.jpg".encode(),
        "image": rng.integers(0, 256, (height, width, 3), dtype=np.uint8),
        "label": np.int64(label),
    }

  def __repr__(self):
    return "ImagenetATest()"


# Setting `num_records` to 5 to limit results.
# For full dataset, set to `len(data_source)`.
index_sampler_example = grain.IndexSampler(
    num_records=5,
    num_epochs=2,
    shard_options=grain.ShardOptions(
        shard_index=0, shard_count=1, drop_remainder=True),
    shuffle=True,
    seed=0)

# Iterator is consumed.
for record_metadata in index_sampler_example:
  print(record_metadata)

# Create new iterator.
index_sampler = grain.IndexSampler(
    num_records=5,
    num_epochs=2,
    shard_options=grain.ShardOptions(
        shard_index=0, shard_count=1, drop_remainder=True),
    shuffle=True,
    seed=0)

# We use a small version of ImageNet data to spare disk and network
# usage for the demo. Prefer "imagenet2012"'s "train" split for a
# complete dataset.
source = ImagenetATest()

print(f"# records: {len(source)}")

print(f"First record:\n{source[0]}")

class ResizeAndCrop(grain.MapTransform):

  def map(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    image = element["image"]
    image = cv2.resize(image, dsize=(256, 256), interpolation=cv2.INTER_LINEAR)
    image = image[:224, :224]
    element["image"] = image
    return element

transformations = [ResizeAndCrop()]

data_loader = grain.DataLoader(
    data_source=source,
    operations=transformations,
    sampler=index_sampler,
    worker_count=0)

for element in data_loader:
  fig = plt.figure
  plt.imshow(element["image"])
  plt.show()

data_iter = iter(data_loader)

num_steps = 5

# Read some elements.
for i in range(num_steps):
  x = next(data_iter)
  print(i, x["file_name"], x["label"])

import tempfile
mngr = ocp.CheckpointManager(tempfile.mkdtemp())

# Save the checkpoint
assert mngr.save(
    step=num_steps, args=grain.GrainCheckpointSave(data_iter), force=True)
# Checkpoint saving in Orbax is asynchronous by default, so we'll wait until
# finished before examining checkpoint.
mngr.wait_until_finished()

# Read more elements and advance the iterator
for i in range(5, 10):
  x = next(data_iter)
  print(i, x["file_name"], x["label"])

# Restore iterator from previously saved checkpoint
mngr.restore(num_steps, args=grain.GrainCheckpointRestore(data_iter))

# Iterator should be set back to start from 5.
for i in range(5, 10):
  x = next(data_iter)
  print(i, x["file_name"], x["label"])

in_memory_datasource = grain.InMemoryDataSource(range(5))

print(in_memory_datasource)
print(f"First Record Read: {in_memory_datasource[0]}")

data_loader = grain.DataLoader(
    data_source=in_memory_datasource,
    sampler=grain.IndexSampler(
      num_records=len(in_memory_datasource),
      num_epochs=2,
      shard_options=grain.NoSharding(),
      shuffle=True,
      seed=0),
    worker_count=5)

data_iter = iter(data_loader)

for i in range(len(in_memory_datasource) * 2):
  x = next(data_iter)
  print(x)

# Following configuration makes 8*10=80 threads reading data.
data_loader = grain.DataLoader(
    data_source=source,
    sampler=grain.IndexSampler(
      num_records=len(source),
      num_epochs=2,
      shard_options=grain.NoSharding(),
      shuffle=True,
      seed=0),
    worker_count=10,
    read_options=grain.ReadOptions(num_threads=8, prefetch_buffer_size=500))
