"""The subprocess side of test_device_put.py: JAX with several CPU devices, or one process
of a 2-process `jax.distributed` run. XLA_FLAGS must be set before JAX starts, so these
run in their own interpreters.

`python device_put_worker.py sharded OUT`: 4 CPU devices in this process; batches put
across them with a NamedSharding; a checkpoint mid-stream with full buffers.

`python device_put_worker.py distributed PROCESS_ID PORT OUT`: 2 CPU devices in each of 2
processes; each process reads its shard and `device_put(..., process_local=True)` builds
global batches over the 4 devices of both.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

ROWS = 8  # rows of a batch in each process
NUM_PROCESSES = 2


PRODUCED = [0]  # batches the pipeline has made, read ahead or not


def count(batch: Any) -> Any:
    PRODUCED[0] += 1
    return batch


def pipeline(shard_index: int = 0, shard_count: int = 1) -> Any:
    import chute

    return (
        chute.MapDataset.range(96)
        .shuffle(seed=5)[shard_index::shard_count]
        .map(lambda x: {"x": np.full((3,), x, np.float32), "id": np.int32(x)})
        .batch(ROWS, drop_remainder=True)
        .to_iter_dataset()
        .map(count)
    )


def ids(batch: Any) -> list[int]:
    return np.asarray(batch["id"]).tolist()


def sharded(out: str) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import chute

    devices = jax.devices()
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))
    ds = chute.experimental.device_put(pipeline(), sharding, cpu_buffer_size=3)
    it = iter(ds)
    first = next(it)
    shards = [
        {"device": s.device.id, "rows": np.asarray(s.data).tolist()}
        for s in first["id"].addressable_shards
    ]
    second = next(it)
    deadline = time.monotonic() + 30
    while PRODUCED[0] < 2 + 3 + 2 and time.monotonic() < deadline:  # both buffers full
        time.sleep(0.01)
    state = it.get_state()
    buffered = PRODUCED[0] - 2
    rest = [ids(b) for b in it]
    restored = iter(ds)
    restored.set_state(json.loads(json.dumps(state)))
    again = [ids(b) for b in restored]
    plain = iter(pipeline())
    plain.set_state(state)
    result = {
        "num_devices": len(devices),
        "type": type(first["x"]).__name__,
        "shape": list(first["x"].shape),
        "sharding_devices": sorted(d.id for d in first["x"].sharding.device_set),
        "shards": shards,
        "first": ids(first),
        "second": ids(second),
        "buffered": buffered,
        "rest": rest,
        "restored": again,
        "without_device_put": [ids(b) for b in plain],
        "all": [ids(b) for b in pipeline()],
    }
    with open(out, "w") as f:
        json.dump(result, f)


def distributed(process_id: int, port: int, out: str) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=NUM_PROCESSES,
        process_id=process_id,
    )
    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    import chute

    shard = chute.sharding.shard_by_jax_process()
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    local = pipeline(shard.shard_index, shard.shard_count)
    it = iter(chute.experimental.device_put(local, sharding, process_local=True))
    total = jax.jit(lambda b: jnp.sum(b["x"][:, 0]))
    steps = []
    for batch in it:
        steps.append(
            {
                "shape": list(batch["x"].shape),
                "local_rows": sorted(
                    int(v) for s in batch["id"].addressable_shards for v in np.asarray(s.data)
                ),
                "global_ids": np.asarray(
                    multihost_utils.process_allgather(batch["id"], tiled=True)
                ).tolist(),
                "sum": float(total(batch)),
            }
        )
    result = {
        "process": [jax.process_index(), jax.process_count()],
        "devices": [len(jax.local_devices()), len(jax.devices())],
        "local_batches": [ids(b) for b in local],
        "steps": steps,
    }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if sys.argv[1] == "sharded":
        sharded(sys.argv[2])
    else:
        distributed(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
