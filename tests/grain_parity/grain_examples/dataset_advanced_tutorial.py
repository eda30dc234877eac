# Grain's "Advanced `Dataset` usage" tutorial (checkpointing with Orbax, mixing datasets),
# its code cells in order, copied from docs/tutorials/dataset_advanced_tutorial.md in
# google/grain (the jupytext twin of dataset_advanced_tutorial.ipynb):
# https://github.com/google/grain/blob/375de1b5889cec1ef976aab2d1f907d673467f6c/docs/tutorials/dataset_advanced_tutorial.md
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
# - The `!pip install ...` cells, `!rm -rf /tmp/orbax`, `!ls -R /tmp/orbax` and
#   `!cat /tmp/orbax/*/*/*.json` (IPython magics) removed.
# - TFDS data (no network here) replaced by local stand-ins of the same shape, built in
#   this file: `import tensorflow_datasets as tfds` -> the `tfds_data_source` function
#   below, `tfds.data_source(...)` -> `tfds_data_source(...)`, and the cell's line that
#   sets TFDS's file format (`tfds.core.DatasetInfo.file_format = ...`) removed.
# - `ocp.CheckpointManager("/tmp/orbax")` -> `ocp.CheckpointManager(tempfile.mkdtemp())`
#   (and `import tempfile`): the tutorial empties /tmp/orbax with a magic before saving;
#   a fresh directory does that without colliding with other runs.
# fmt: off

import chute as grain
import numpy as np
from pprint import pprint


# Stand-ins for TFDS's "mnist" (60,000 train records) and "pneumonia_mnist" (4,708):
# records {"image": uint8 (28, 28, 1), "label": int64}, made from the record's index.
class _StandInSource:

  def __init__(self, name, num_records, num_classes):
    self._name, self._num_records, self._num_classes = name, num_records, num_classes

  def __len__(self):
    return self._num_records

  def __getitem__(self, record_key):
    rng = np.random.default_rng([self._num_classes, record_key])
    return {
        "image": rng.integers(0, 256, (28, 28, 1), dtype=np.uint8),
        "label": np.int64(rng.integers(self._num_classes)),
    }

  def __repr__(self):
    return f"StandIn({self._name!r})"


def tfds_data_source(name, split):
  assert split == "train"
  return {"mnist": _StandInSource("mnist", 60_000, 10),
          "pneumonia_mnist": _StandInSource("pneumonia_mnist", 4_708, 2)}[name]


ds = (
    grain.MapDataset.source(tfds_data_source("mnist", split="train"))
    .seed(seed=45)
    .shuffle()
    .to_iter_dataset()
)

num_steps = 4
ds_iter = iter(ds)

# Read some elements.
for i in range(num_steps):
  x = next(ds_iter)
  print(i, x["label"])

import orbax.checkpoint as ocp
import tempfile

mngr = ocp.CheckpointManager(tempfile.mkdtemp())

# Save the checkpoint.
assert mngr.save(
    step=num_steps, args=grain.checkpoint.CheckpointSave(ds_iter), force=True
)
# Checkpoint saving in Orbax is asynchronous by default, so we'll wait until
# finished before examining checkpoint.
mngr.wait_until_finished()

# Read more elements and advance the iterator.
for i in range(4, 8):
  x = next(ds_iter)
  print(i, x["label"])

# Restore iterator from the previously saved checkpoint.
mngr.restore(num_steps, args=grain.checkpoint.CheckpointRestore(ds_iter))
# Iterator should be set back to start from 4.
for i in range(4, 8):
  x = next(ds_iter)
  print(i, x["label"])

# This particular dataset mixes medical images with hand written numbers,
# probably not useful but allows to illustrate the API on small datasets.
source1 = tfds_data_source(name="pneumonia_mnist", split="train")
source2 = tfds_data_source(name="mnist", split="train")
ds1 = grain.MapDataset.source(source1).map(lambda features: features["image"])
ds2 = grain.MapDataset.source(source2).map(lambda features: features["image"])
ds = grain.MapDataset.mix([ds1, ds2], weights=[0.7, 0.3])
print(f"Mixed dataset length = {len(ds)}")
pprint(np.shape(ds[0]))

source1 = tfds_data_source(name="pneumonia_mnist", split="train")
source2 = tfds_data_source(name="mnist", split="train")
ds1 = (
    grain.MapDataset.source(source1)
    .filter(lambda features: int(features["label"]) == 1)
    .to_iter_dataset()
)
ds2 = (
    grain.MapDataset.source(source2)
    .filter(lambda features: int(features["label"]) > 4)
    .to_iter_dataset()
)

ds = grain.IterDataset.mix([ds1, ds2], weights=[0.7, 0.3]).map(
    lambda features: features["image"]
)
pprint(np.shape(next(iter(ds))))

source1 = tfds_data_source(name="pneumonia_mnist", split="train")
source2 = tfds_data_source(name="mnist", split="train")
ds1 = grain.MapDataset.source(source1).repeat()
ds2 = grain.MapDataset.source(source2).repeat()

ds = grain.MapDataset.mix([ds1, ds2], weights=[1, 2])
print(f"Mixed dataset length = {len(ds1)}")  # sys.maxsize
print(f"Mixed dataset length = {len(ds2)}")  # sys.maxsize
# Ds1 and ds2 are repeated to fill out the sys.maxsize with respect to weights.
print(f"Mixed dataset length = {len(ds)}")  # sys.maxsize

source1 = tfds_data_source(name="pneumonia_mnist", split="train")
source2 = tfds_data_source(name="mnist", split="train")
ds1 = grain.MapDataset.source(source1).seed(42).shuffle().repeat()
ds2 = grain.MapDataset.source(source2).seed(43).shuffle().repeat()

ds = grain.MapDataset.mix([ds1, ds2], weights=[1, 2])
print(f"Mixed dataset length = {len(ds)}")  # sys.maxsize
