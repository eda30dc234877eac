"""`chute.torch`: tensors without copies, pin_memory, the IterableDataset adapter (ranks,
torch workers, epochs, state) and a real 2-rank gloo training loop."""

from __future__ import annotations

import collections
import gc
import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import chute
from process_helpers import wait_all

torch = pytest.importorskip("torch", reason="torch not installed: pip install 'chute[torch]'")
from torch.utils.data import DataLoader  # noqa: E402

import chute.torch as ct  # noqa: E402

WORKER = Path(__file__).parent / "torch_train_worker.py"


def flat(batches: list[Any]) -> list[int]:
    """The elements of batches (tensors or lists) or of single elements, in order."""
    out: list[int] = []
    for b in batches:
        b = b.tolist() if hasattr(b, "tolist") else b
        out += b if isinstance(b, list) else [b]
    return out


# -- tensors -----------------------------------------------------------------------------


def test_to_tensors_shares_memory_and_keeps_the_tree() -> None:
    Pair = collections.namedtuple("Pair", "a b")
    batch: dict[str, Any] = {
        "image": np.zeros((2, 3, 4), np.uint8),
        "label": np.arange(2, dtype=np.int64),
        "mask": np.array([True, False]),
        "pair": Pair(np.ones(2, np.float16), "text"),
        "ids": [np.int32(3), 4.5, b"raw"],
        "names": np.array(["a", "b"]),
    }
    out = ct.to_tensors(batch)
    assert out["image"].dtype == torch.uint8 and out["label"].dtype == torch.int64
    assert out["mask"].dtype == torch.bool and out["pair"].a.dtype == torch.float16
    assert isinstance(out["pair"], Pair) and out["pair"].b == "text"
    assert (
        out["ids"][0].dim() == 0 and out["ids"][0].item() == 3 and out["ids"][1:] == [4.5, b"raw"]
    )
    assert out["names"] is batch["names"]  # torch has no string tensors
    for key in ("image", "label", "mask"):
        assert out[key].data_ptr() == batch[key].ctypes.data  # the same memory
    out["image"][0, 0, 0] = 9
    assert batch["image"][0, 0, 0] == 9


def test_read_only_and_flipped_arrays_are_copied() -> None:
    read_only = np.arange(4)
    read_only.flags.writeable = False
    flipped = np.arange(6).reshape(2, 3)[:, ::-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it shares a read-only array
        t_ro, t_flip = ct.to_tensors([read_only, flipped])
    assert t_ro.tolist() == [0, 1, 2, 3] and t_ro.data_ptr() != read_only.ctypes.data
    assert t_flip.tolist() == flipped.tolist()


def big(i: int) -> np.ndarray:
    return np.full((256, 1024), i, np.float32)  # 1 MiB: sent through the shared-memory slab


def _shm_ranges() -> list[tuple[int, int]]:
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if "/dev/shm/" in line:
            lo, hi = line.split()[0].split("-")
            ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc (Linux)")
def test_tensors_from_worker_shared_memory_are_views_that_stay_valid() -> None:
    ds = (
        chute.MapDataset.range(200)
        .map(big)
        .to_iter_dataset()
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    )
    # While a program's first pool waits for the forkserver, the consumer computes the
    # elements asked for itself (docs/performance.md): on a loaded machine, all of these
    # cheap ones. A pool first, so that this one's elements come from the workers' slabs.
    options = chute.MultiprocessingOptions(num_workers=1)
    list(chute.MapDataset.range(2).to_iter_dataset().mp_prefetch(options))
    it = iter(ds)
    try:
        arrays: list[np.ndarray] = []
        for _ in range(60):
            a = next(it)
            if any(lo <= a.ctypes.data < hi for lo, hi in _shm_ranges()):
                arrays.append(a)
            if len(arrays) == 3:
                break
        assert len(arrays) == 3, "the workers computed too few of the first 60 elements"
        values = [float(a[0, 0]) for a in arrays]
        held = [ct.to_tensors(a) for a in arrays]
        for a, t in zip(arrays, held):
            assert t.data_ptr() == a.ctypes.data  # no copy
        del arrays, a
        gc.collect()
        for _ in range(120):  # far more than the slabs hold at once: regions are reused
            next(it)
        assert [float(t[0, 0]) for t in held] == values
        assert all(bool((t == v).all()) for v, t in zip(values, held))
    finally:
        it.close()


def test_pin_memory_without_cuda_warns_once_and_keeps_the_tensors() -> None:
    if torch.cuda.is_available():
        batch = ct.pin_memory({"x": np.ones(3, np.float32)})
        assert batch["x"].is_pinned()
        return
    import chute._src.frameworks.torch_tensors as impl

    impl._warned_no_cuda = False
    x = np.ones(3, np.float32)
    with pytest.warns(RuntimeWarning, match="no CUDA device is available, so nothing is pinned"):
        out = ct.pin_memory({"x": x})
    assert out["x"].data_ptr() == x.ctypes.data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.pin_memory({"x": x})  # once only


# -- the IterableDataset adapter ---------------------------------------------------------


def shuffled(n: int = 50) -> chute.MapDataset[int]:
    return chute.MapDataset.range(n).shuffle(seed=1)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_two_torch_workers_read_disjoint_parts_that_cover_the_epoch(batch_size: int | None) -> None:
    ds = ct.IterableDataset(shuffled(), batch_size=batch_size)
    out = flat(list(DataLoader(ds, batch_size=None, num_workers=2)))
    assert sorted(out) == list(range(50))  # no duplicates, no gaps
    if batch_size is None:  # one element per turn: torch's round robin is the epoch's order
        assert out == list(shuffled())


def test_ranks_and_workers_split_the_data_with_no_overlap() -> None:
    parts = []
    for rank in range(3):
        shard = chute.sharding.ShardOptions(rank, 3)
        ds = ct.IterableDataset(shuffled(50), batch_size=3, shard_options=shard)
        parts.append(flat(list(DataLoader(ds, batch_size=None, num_workers=2))))
    everything = [x for p in parts for x in p]
    assert sorted(everything) == list(range(50))
    assert [len(p) for p in parts] == [17, 17, 16]


def test_drop_remainder_gives_every_rank_the_same_count() -> None:
    counts = []
    for rank in range(3):
        shard = chute.sharding.ShardOptions(rank, 3, drop_remainder=True)
        ds = ct.IterableDataset(
            shuffled(50), batch_size=4, drop_remainder=True, shard_options=shard
        )
        counts.append(len(list(ds)))
    assert counts == [4, 4, 4]


def test_each_epoch_is_a_new_shuffle_and_epochs_advance_by_themselves() -> None:
    ds = ct.IterableDataset(shuffled(30))
    epochs = [flat(list(ds)) for _ in range(3)]
    assert ds.epoch == 3
    assert all(sorted(e) == list(range(30)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2]
    again = ct.IterableDataset(shuffled(30))
    again.set_epoch(2)
    assert flat(list(again)) == epochs[2]  # an epoch's order depends on its number alone
    # torch starts fresh workers each epoch: set_epoch reaches them through the copy
    loader = DataLoader(again, batch_size=None, num_workers=2)
    again.set_epoch(1)
    assert sorted(flat(list(loader))) == list(range(30))
    assert flat(list(loader)) != flat(list(DataLoader(ds, batch_size=None, num_workers=2)))


def test_persistent_workers_move_on_to_the_next_epoch_by_themselves() -> None:
    ds = ct.IterableDataset(shuffled(30), batch_size=3)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    first, second = flat(list(loader)), flat(list(loader))
    assert sorted(first) == sorted(second) == list(range(30))
    assert first != second
    fresh = ct.IterableDataset(shuffled(30), batch_size=3)
    fresh.set_epoch(1)
    assert second == flat(list(DataLoader(fresh, batch_size=None, num_workers=2)))


def test_set_epoch_rejects_a_bad_value() -> None:
    with pytest.raises(ValueError, match=r"epoch=-1 is invalid: it must be an int >= 0"):
        ct.IterableDataset(shuffled()).set_epoch(-1)


def test_state_dict_resumes_mid_epoch_in_one_process() -> None:
    ds = ct.IterableDataset(shuffled(), batch_size=4)
    ds.set_epoch(1)
    it = iter(ds)
    seen = [next(it).tolist() for _ in range(5)]
    state = json.loads(json.dumps(ds.state_dict()))
    rest = [b.tolist() for b in it]
    resumed = ct.IterableDataset(shuffled(), batch_size=4)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert [b.tolist() for b in resumed] == rest
    assert sorted(flat(seen + rest)) == list(range(50))
    assert resumed.epoch == 2


def test_stateful_dataloader_with_two_workers_resumes_the_remaining_batches() -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata not installed")

    def loader() -> Any:
        return sdl.StatefulDataLoader(
            ct.IterableDataset(shuffled(), batch_size=4), batch_size=None, num_workers=2
        )

    first = loader()
    it = iter(first)
    seen = [next(it).tolist() for _ in range(5)]
    state = first.state_dict()
    rest = [b.tolist() for b in it]
    second = loader()
    second.load_state_dict(state)
    assert [b.tolist() for b in second] == rest
    assert sorted(flat(seen + rest)) == list(range(50))


def test_a_state_restores_only_into_its_own_worker_and_rank() -> None:
    ds = ct.IterableDataset(shuffled(), shard_options=chute.sharding.ShardOptions(1, 2))
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    other = ct.IterableDataset(shuffled(), shard_options=chute.sharding.ShardOptions(0, 2))
    other.load_state_dict(state)
    with pytest.raises(
        chute.CheckpointError,
        match=r"the state is of rank 1 of 2, torch worker 0 of 1, but it is loaded into rank 0 of 2",
    ):
        iter(other)
    with pytest.raises(chute.CheckpointError, match=r"expected the dict state_dict\(\) returns"):
        other.load_state_dict({"epoch": 0})


class HFLike:
    """What a Hugging Face `datasets.Dataset` offers a loader: `__len__`, `__getitem__` of an
    int (a dict of one row) or of a list (a dict of columns), `__getitems__` (rows)."""

    def __init__(self, n: int) -> None:
        self.columns: dict[str, list[Any]] = {
            "text": [f"row {i}" for i in range(n)],
            "label": [i % 3 for i in range(n)],
        }

    def __len__(self) -> int:
        return len(self.columns["label"])

    def __getitem__(self, key: Any) -> dict[str, Any]:
        if isinstance(key, list):
            return {c: [v[i] for i in key] for c, v in self.columns.items()}
        return {c: v[key] for c, v in self.columns.items()}

    def __getitems__(self, keys: list[int]) -> list[dict[str, Any]]:
        batch = self[keys]
        return [{c: batch[c][j] for c in batch} for j in range(len(keys))]


def test_a_hugging_face_like_dataset_is_a_source() -> None:
    source = HFLike(20)
    ds = ct.IterableDataset(
        chute.MapDataset.source(source).shuffle(seed=4).map(lambda r: {**r, "n": len(r["text"])}),
        batch_size=5,
    )
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert sorted(t for b in batches for t in b["text"]) == sorted(source.columns["text"])
    assert all(b["label"].dtype == torch.int64 for b in batches)
    direct = ct.IterableDataset(source)  # a map-style source as it is
    assert [r["text"] for r in direct] == source.columns["text"]


@pytest.mark.parametrize(
    "args, error, match",
    [
        (
            {"dataset": iter(range(3))},
            TypeError,
            r"neither a chute.MapDataset nor a random-access source",
        ),
        ({"dataset": chute.MapDataset.range(3).repeat()}, ValueError, r"repeats forever"),
        ({"batch_size": 0}, ValueError, r"batch_size=0 is invalid: it must be a positive int"),
        ({"shard_options": (0, 2)}, TypeError, r"is not a chute.sharding.ShardOptions"),
    ],
)
def test_bad_arguments_are_named(args: dict[str, Any], error: type, match: str) -> None:
    kwargs: dict[str, Any] = {"dataset": shuffled(), **args}
    with pytest.raises(error, match=match):
        ct.IterableDataset(kwargs.pop("dataset"), **kwargs)


def test_shard_by_torch_rank_outside_a_distributed_run() -> None:
    with pytest.raises(ValueError, match=r"not a torch\.distributed run .*init_process_group"):
        ct.shard_by_torch_rank()
    assert ct.IterableDataset(shuffled()).shard_options == chute.sharding.NoSharding()


# -- a real 2-rank gloo training loop ------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(phase: str, ckpt: Path, tmp_path: Path) -> list[dict[str, Any]]:
    port = str(_free_port())
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "OMP_NUM_THREADS": "1",
    }
    outs = [tmp_path / f"{phase}{r}.json" for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), phase, str(r), port, str(ckpt), str(outs[r])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    wait_all(procs, timeout=180)
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.slow
def test_two_gloo_ranks_train_on_disjoint_data_and_resume_mid_epoch(tmp_path: Path) -> None:
    sys.path.insert(0, str(WORKER.parent))
    import torch_train_worker as w

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    trained = _run_ranks("train", ckpt, tmp_path)
    resumed = _run_ranks("resume", ckpt, tmp_path)
    per_rank = w.RECORDS // w.WORLD_SIZE
    steps = per_rank // 4
    for t, r in zip(trained, resumed):
        assert t["steps"] == steps  # 2 torch workers x 4 batches of 4
        assert r["after"] == t["after"]  # the same remaining batches after the restore
        assert len(r["after"]) == steps - w.SAVE_AT
        np.testing.assert_allclose(r["weights"][0], t["weights"][0], rtol=1e-6)
    # the ranks trained on disjoint data (checked on the batches after the checkpoint and
    # on the whole epoch of each rank's part)
    a, b = (set(flat(x["after"])) for x in trained)
    assert not a & b
    ds = chute.MapDataset.source(w.Rows()).shuffle(seed=11)
    parts = [
        {r["id"] for r in ct.IterableDataset(ds, shard_options=chute.sharding.ShardOptions(k, 2))}
        for k in range(2)
    ]
    assert not parts[0] & parts[1] and len(parts[0] | parts[1]) == w.RECORDS
