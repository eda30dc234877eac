# Grain's "Plugging Grain into JAX training: batching + accelerator transfer" tutorial, its
# code cells in order, copied from docs/tutorials/jax_training_tutorial.md in google/grain
# (the jupytext twin of jax_training_tutorial.ipynb):
# https://github.com/google/grain/blob/119505bde1cf489425318d67e497a3aea740e7ee/docs/tutorials/jax_training_tutorial.md
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
# - The `!pip install ...` cell (IPython magics) removed.
# - TFDS data (no network here) replaced by a local stand-in of the same shape, built in
#   this file: `import tensorflow_datasets as tfds` -> the `MnistTrain` class below,
#   `tfds.data_source("mnist", split="train")` -> `MnistTrain()`.
# fmt: off

import chute as grain
import jax
import jax.numpy as jnp
import numpy as np


# Stand-in for TFDS's "mnist" train split: 60,000 records {"image": uint8 (28, 28, 1),
# "label": int64}, made from the record's index.
class MnistTrain:

  def __len__(self):
    return 60_000

  def __getitem__(self, record_key):
    rng = np.random.default_rng(record_key)
    return {
        "image": rng.integers(0, 256, (28, 28, 1), dtype=np.uint8),
        "label": np.int64(rng.integers(10)),
    }

  def __repr__(self):
    return "MnistTrain()"


source = MnistTrain()

ds = (
    grain.MapDataset.source(source)
    .seed(42)
    .shuffle()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(batch_size=128, drop_remainder=True)  # new leading dim
    .to_iter_dataset()
)

for batch in ds:
    batch = jax.device_put(batch)  # default device
    print(jax.tree.map(lambda x: (x.shape, x.dtype), batch))
    break

ds = (
    grain.MapDataset.source(source)
    .seed(42)
    .shuffle()
    .repeat()  # infinite stream
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(128, drop_remainder=True)
)
print("length:", len(ds))  # sys.maxsize

def pad_collate(items):
    max_len = max(x["tokens"].shape[0] for x in items)
    tokens = np.stack([
        np.pad(x["tokens"], (0, max_len - x["tokens"].shape[0]))
        for x in items
    ])
    return {"tokens": tokens}

# Toy stream of variable-length token sequences.
ragged = grain.MapDataset.source(
    [{"tokens": np.arange(np.random.randint(2, 6))} for _ in range(16)]
)
ragged = ragged.batch(4, batch_fn=pad_collate, drop_remainder=True)
print(ragged[0]["tokens"].shape)

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(128, drop_remainder=True)
    .to_iter_dataset()
)

for step, batch in zip(range(2), ds):
    batch = jax.device_put(batch)
    print(step, batch["image"].sharding)

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(128, drop_remainder=True)
    .to_iter_dataset()
)
ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=4)
ds = ds.map(jax.device_put)  # transfer still on iter thread

first = next(iter(ds))
print(first["image"].shape, first["image"].sharding)

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(128, drop_remainder=True)
    .to_iter_dataset()
)

ds = grain.experimental.device_put(
    ds=ds,
    device=jax.devices()[0],     # or a Sharding (see below)
    cpu_buffer_size=4,           # batches buffered on host
    device_buffer_size=2,        # batches buffered on device
)

for step, batch in zip(range(2), ds):
    # `batch` is already a jax.Array on-device.
    print(step, batch["image"].sharding)

devices = jax.devices()
mesh = jax.sharding.Mesh(np.array(devices), axis_names=("data",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle().repeat()
    .map(lambda r: {"image": r["image"].astype(np.float32) / 255.0,
                    "label": r["label"]})
    .batch(128, drop_remainder=True)
    .to_iter_dataset()
)

ds = grain.experimental.device_put(
    ds=ds,
    device=sharding,
    cpu_buffer_size=4,
    device_buffer_size=2,
)

batch = next(iter(ds))
print(batch["image"].sharding)

BATCH = 256
devices = jax.devices()
mesh = jax.sharding.Mesh(np.array(devices), axis_names=("data",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))

def preprocess(r):
    return {"image": r["image"].astype(np.float32) / 255.0,
            "label": r["label"]}

ds = (
    grain.MapDataset.source(source)
    .seed(42).shuffle().repeat()
    .map(preprocess)
    .batch(BATCH, drop_remainder=True)
    .to_iter_dataset()
)

ds = grain.experimental.device_put(
    ds=ds, device=sharding,
    cpu_buffer_size=4, device_buffer_size=2,
)

@jax.jit
def train_step(params, batch):
    # Replace with your real loss/update.
    return params + batch["image"].mean()

params = jnp.zeros(())
for step, batch in zip(range(3), ds):
    params = train_step(params, batch)
print("final params:", params)
