"""`chute.experimental.device_put`: batches as jax.Arrays, computed and transferred ahead,
with the state of the element the consumer sees next. Sharded across 4 CPU devices and in
a 2-process `jax.distributed` run, each in its own interpreter (device_put_worker.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute.testing import assert_equal_output_after_checkpoint
from process_helpers import wait_all

jax = pytest.importorskip("jax", reason="jax not installed: pip install 'chute[jax]'")

WORKER = Path(__file__).parent / "device_put_worker.py"


def batches(n: int = 40, size: int = 4) -> chute.IterDataset[Any]:
    return (
        chute.MapDataset.range(n)
        .shuffle(seed=2)
        .map(lambda x: {"x": np.full((2,), x, np.float32), "id": np.int32(x)})
        .to_iter_dataset()
        .batch(size)
    )


def ids(batch: Any) -> list[int]:
    return np.asarray(batch["id"]).tolist()


def test_batches_become_jax_arrays_on_the_device_with_the_same_values() -> None:
    device = jax.devices()[0]
    out = list(chute.experimental.device_put(batches(), device))
    expected = list(batches())
    assert len(out) == len(expected) == 10
    for got, want in zip(out, expected):
        assert isinstance(got["x"], jax.Array) and isinstance(got["id"], jax.Array)
        assert got["x"].devices() == {device}
        np.testing.assert_array_equal(np.asarray(got["x"]), want["x"])
        assert ids(got) == want["id"].tolist()


@pytest.mark.parametrize("cpu, dev", [(4, 2), (0, 2), (3, 0), (0, 0), (1, 1)])
def test_restores_exactly_at_every_step(cpu: int, dev: int) -> None:
    def on_host(ds: chute.IterDataset[Any]) -> chute.IterDataset[Any]:
        return ds.map(lambda b: jax.tree.map(np.asarray, b))

    ds = chute.experimental.device_put(
        batches(24), jax.devices()[0], cpu_buffer_size=cpu, device_buffer_size=dev
    )
    assert_equal_output_after_checkpoint(on_host(ds), restore_into=on_host(batches(24)))
    assert_equal_output_after_checkpoint(on_host(batches(24)), restore_into=on_host(ds))


def test_a_checkpoint_with_full_buffers_loses_no_batch() -> None:
    produced = [0]

    def count(batch: Any) -> Any:
        produced[0] += 1
        return batch

    ds = chute.experimental.device_put(
        batches(80).map(count), jax.devices()[0], cpu_buffer_size=4, device_buffer_size=2
    )
    it = iter(ds)
    seen = [ids(next(it)) for _ in range(3)]
    deadline = time.monotonic() + 30
    while produced[0] < 3 + 4 + 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert produced[0] >= 3 + 4 + 2  # host and device buffers hold 6+ batches now
    state = json.loads(json.dumps(it.get_state()))
    rest = [ids(b) for b in it]
    restored = iter(ds)
    restored.set_state(state)
    assert [ids(b) for b in restored] == rest
    assert seen + rest == [ids(b) for b in batches(80)]


def test_the_state_is_the_one_of_the_pipeline_without_it() -> None:
    it = iter(chute.experimental.device_put(batches(), jax.devices()[0]))
    plain = iter(batches())
    for _ in range(4):
        next(it)
        next(plain)
    assert it.get_state() == plain.get_state()


def _prefetch_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "chute-prefetch" and t.is_alive()}


def test_threads_stop_when_closed_and_when_dropped() -> None:
    before = _prefetch_threads()
    it = iter(chute.experimental.device_put(batches(400, 1), jax.devices()[0]))
    next(it)
    assert len(_prefetch_threads() - before) == 2  # the host and the transfer threads
    it.close()
    assert not _prefetch_threads() - before
    it = iter(chute.experimental.device_put(batches(400, 1), jax.devices()[0]))
    next(it)
    del it
    deadline = time.monotonic() + 10
    while _prefetch_threads() - before:
        assert time.monotonic() < deadline, "device_put threads still alive"
        time.sleep(0.01)


def test_an_error_arrives_at_its_position() -> None:
    def fail_at_5(x: int) -> int:
        if x == 5:
            raise KeyError("bad record 5")
        return x

    ds = chute.MapDataset.range(10).map(fail_at_5).to_iter_dataset()
    it = iter(chute.experimental.device_put(ds, jax.devices()[0]))
    assert [int(next(it)) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(KeyError, match="bad record 5"):
        next(it)


def test_an_element_jax_cannot_hold_is_named() -> None:
    ds = chute.MapDataset.range(3).map(lambda x: {"text": f"row {x}"}).to_iter_dataset()
    it = iter(chute.experimental.device_put(ds, jax.devices()[0]))
    with pytest.raises(TypeError) as info:
        next(it)
    assert "leaves: str" in str(info.value.__notes__)
    assert "drop other fields" in str(info.value.__notes__)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"cpu_buffer_size": -1},
            ValueError,
            r"cpu_buffer_size=-1 is invalid: it must be an int >= 0",
        ),
        ({"device_buffer_size": 1.5}, ValueError, r"device_buffer_size=1.5 is invalid"),
        ({"device": "gpu:0"}, TypeError, r"device='gpu:0' is not a device: pass a jax.Device"),
        (
            {"process_local": True},
            TypeError,
            r"process_local=True needs device to be a jax.sharding.Sharding",
        ),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], error: type, match: str) -> None:
    args: dict[str, Any] = {"device": jax.devices()[0], **kwargs}
    with pytest.raises(error, match=match):
        chute.experimental.device_put(batches(), **args)


def test_a_map_dataset_is_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match=r"not an IterDataset: call .to_iter_dataset\(\)"):
        chute.experimental.device_put(chute.MapDataset.range(3), jax.devices()[0])  # type: ignore[arg-type]


def test_make_global_arrays_with_one_process_is_device_put() -> None:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    batch = next(iter(batches()))
    out = chute.experimental.make_global_arrays(batch, sharding)
    assert out["x"].sharding == sharding
    np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"])
    with pytest.raises(TypeError, match=r"is not a jax\.sharding\.Sharding"):
        chute.experimental.make_global_arrays(batch, jax.devices()[0])


def _run(args: list[str], env_extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {
        "JAX_PLATFORMS": "cpu",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        **(env_extra or {}),
    }
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def test_sharded_across_four_cpu_devices_and_restored_with_full_buffers(tmp_path: Path) -> None:
    out = tmp_path / "sharded.json"
    wait_all([_run(["sharded", str(out)])])
    r = json.loads(out.read_text())
    assert r["num_devices"] == 4 and r["type"] == "ArrayImpl" and r["shape"] == [8, 3]
    assert r["sharding_devices"] == [0, 1, 2, 3]
    # each device holds its quarter of the batch, in order
    assert [s["device"] for s in r["shards"]] == [0, 1, 2, 3]
    assert [v for s in r["shards"] for v in s["rows"]] == r["first"]
    assert all(len(s["rows"]) == 2 for s in r["shards"])
    assert r["buffered"] >= 5  # computed ahead when the state was taken
    assert r["all"][:2] == [r["first"], r["second"]]
    assert r["rest"] == r["all"][2:] == r["restored"] == r["without_device_put"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_jax_processes_build_global_batches_from_their_shards(tmp_path: Path) -> None:
    port = str(_free_port())
    outs = [tmp_path / f"process{i}.json" for i in range(2)]
    wait_all([_run(["distributed", str(i), port, str(outs[i])]) for i in range(2)])
    r0, r1 = (json.loads(o.read_text()) for o in outs)
    assert r0["process"] == [0, 2] and r1["process"] == [1, 2]
    assert r0["devices"] == r1["devices"] == [2, 4]
    assert r0["local_batches"] and set(map(tuple, r0["local_batches"])).isdisjoint(
        map(tuple, r1["local_batches"])
    )
    assert len(r0["steps"]) == len(r1["steps"]) == len(r0["local_batches"])
    for k, (s0, s1) in enumerate(zip(r0["steps"], r1["steps"])):
        mine0, mine1 = r0["local_batches"][k], r1["local_batches"][k]
        # the global batch: process 0's rows, then process 1's, on 4 devices of 2 processes
        assert s0["shape"] == s1["shape"] == [16, 3]
        assert s0["global_ids"] == s1["global_ids"] == mine0 + mine1
        assert s0["local_rows"] == sorted(mine0) and s1["local_rows"] == sorted(mine1)
        assert s0["sum"] == s1["sum"] == float(sum(mine0 + mine1))
