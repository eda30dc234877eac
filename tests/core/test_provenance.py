"""`chute.experimental.provenance`: the records behind a step, found from positions and
seeds. Every element here carries the identity of its source record, so the records that
provenance names are compared with what the step holds."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import experimental as ex
from chute.experimental import ProvenanceError, provenance, skip

# -- elements that carry their source record's identity ---------------------------------------


def record(base: int, i: int) -> dict[str, Any]:
    return {"id": base + int(i), "t": np.arange(1 + int(i) % 4, dtype=np.int64)}


def source(base: int, n: int) -> chute.MapDataset[Any]:
    return chute.MapDataset.range(n).map(functools.partial(record, base))


def keep(x: Any) -> bool:
    return int(np.asarray(x["id"]).ravel()[0]) % 3 != 0


def add_one(x: dict[str, Any]) -> dict[str, Any]:
    return {**x, "t": x["t"] + 1}


def ids_only(x: dict[str, Any]) -> dict[str, Any]:
    return {"id": x["id"]}


def length(x: dict[str, Any]) -> int:
    return len(x["t"])


def as_sequence(x: dict[str, Any]) -> dict[str, Any]:
    return {"id": np.full(len(x["t"]), x["id"]), "t": x["t"]}


def shard_reader(k: int) -> Any:
    for i in range(4 + k):
        yield {"id": 100 * k + i, "t": np.arange(1 + i % 3)}


def ids_in(element: Any) -> list[int]:
    """The record ids a step holds: an element, a batch, a packed row."""
    if isinstance(element, dict) and "id_segment_ids" in element:
        out = []
        for ids, seg in zip(np.atleast_2d(element["id"]), np.atleast_2d(element["id_segment_ids"])):
            out += [int(ids[seg == s][0]) for s in dict.fromkeys(seg[seg != 0].tolist())]
        return out
    if isinstance(element, tuple):
        return [i for part in element for i in ids_in(part)]
    return [int(i) for i in np.asarray(element["id"]).ravel()]


BASES: dict[Any, int] = {None: 0, 0: 0, 1: 1000, "a": 0, "b": 1000}
# A zip of (a concatenation of two, a third): sources "0/0", "0/1" and 1.
ZIP_BASES: dict[Any, int] = {"0/0": 0, "0/1": 1000, 1: 2000}


def ids_named(records: list[dict[str, Any]]) -> list[int]:
    """The ids the records name: the source's base (by its name) plus the index; for a
    stream of shards, the shard's base."""
    out = []
    for r in records:
        bases = ZIP_BASES if isinstance(r["source"], str) and "/" in r["source"] else BASES
        if r["source"] == 1 and r["offset"] == (1,):
            bases = ZIP_BASES
        base = 100 * r["shard"] if "shard" in r else bases[r["source"]]
        out.append(base + r["index"])
    return out


def traced(ds: Any, steps: Any) -> list[list[dict[str, Any]]]:
    """`provenance` from a fresh iterator of `ds`, closed after."""
    it = iter(ds)
    try:
        return provenance(it, steps)
    finally:
        it.close()


class Split(ex.FlatMapTransform):
    """An element into as many parts as its id modulo 3 (none for a multiple of 3)."""

    max_fan_out = 2

    def flat_map(self, element: Any) -> list[Any]:
        return [{"id": element["id"]}] * (int(element["id"]) % 3)


def as_row(x: dict[str, Any]) -> dict[str, Any]:
    """A batch's worth of rows from one record: as many rows as its tokens, each its id."""
    return {"id": np.full(len(x["t"]), x["id"])}


PIPELINES: dict[str, Callable[[], chute.IterDataset[Any]]] = {
    "shuffle_repeat_batch": lambda: source(0, 30).seed(1).shuffle().repeat(2).map(ids_only).batch(4).to_iter_dataset(),
    "slice_window_shuffle": lambda: ex.WindowShuffleMapDataset(source(0, 40)[3:37:2], window_size=5, seed=2)
    .to_iter_dataset(),
    "map_filter_batch": lambda: source(0, 40).seed(2).shuffle().filter(keep).map(ids_only).batch(3).to_iter_dataset(),
    "iter_filter_batch": lambda: source(0, 40).seed(3).shuffle().to_iter_dataset().filter(keep).map(ids_only).batch(3),
    "map_mix": lambda: chute.MapDataset.mix([source(0, 20), source(1000, 30)], [1, 2]).to_iter_dataset(),
    "iter_mix_named": lambda: chute.IterDataset.mix(
        {"a": source(0, 12).to_iter_dataset(), "b": source(1000, 40).to_iter_dataset()}, {"a": 1, "b": 3}
    ).map(ids_only).batch(2),
    "concat_zip": lambda: ex.ZipMapDataset(
        [chute.MapDataset.concatenate([source(0, 5), source(1000, 6)]), source(2000, 20)]
    ).to_iter_dataset(),
    "interleave_repeat_limit": lambda: ex.InterleaveIterDataset(
        [chute.IterDataset.source(functools.partial(shard_reader, k)) for k in range(3)], cycle_length=2
    ).repeat(2).limit(25),
    "batch_by_tokens": lambda: source(0, 40).seed(4).shuffle().to_iter_dataset()
    .batch_by_tokens(8, length_fn=length, window_size=6, sort=True, seed=1),
    "bucket": lambda: source(0, 40).to_iter_dataset()
    .bucket_by_sequence_length(length, [2, 3], [2, 3, 2], drop_remainder=False),
    "first_fit": lambda: ex.FirstFitPackIterDataset(
        source(0, 40).to_iter_dataset().map(as_sequence), length_struct={"id": 6, "t": 6},
        num_packing_bins=3, shuffle_bins=True, seed=1,
    ).batch(2),
    "concat_then_split": lambda: ex.ConcatThenSplitIterDataset(
        source(0, 30).to_iter_dataset().map(as_sequence), length_struct={"id": 5, "t": 5}
    ),
    "window_shuffle_iter_prefetch": lambda: ex.WindowShuffleIterDataset(
        source(0, 30).to_iter_dataset(), window_size=7, seed=3
    ).prefetch(4),
    "flat_map_map": lambda: ex.FlatMapMapDataset(source(0, 20).seed(1).shuffle().filter(keep), Split())
    .repeat(2).to_iter_dataset().batch(3),
    "flat_map_iter": lambda: ex.FlatMapIterDataset(
        source(0, 20).seed(1).shuffle().to_iter_dataset().filter(keep), Split()
    ).batch(4),
    "rebatch": lambda: ex.RebatchIterDataset(
        source(0, 25).seed(5).shuffle().to_iter_dataset().map(ids_only).batch(3), 4
    ),
    "rebatch_packed_rows": lambda: ex.RebatchIterDataset(
        ex.FirstFitPackIterDataset(
            source(0, 30).to_iter_dataset().map(as_sequence), length_struct={"id": 6, "t": 6},
            num_packing_bins=2,
        ).batch(3),
        2,
    ),
    "select_from_datasets": lambda: chute.MapDataset.select_from_datasets(
        [source(0, 4), source(1000, 3)], [(1, 2), (0, 0), (0, 3), (1, 0)]
    ).repeat(3).to_iter_dataset(),
    "zip_iter_strict": lambda: ex.ZipIterDataset(
        [source(0, 9).to_iter_dataset(), source(2000, 9).to_iter_dataset().map(ids_only)]
    ),
}  # fmt: skip


def _run(ds: chute.IterDataset[Any]) -> list[Any]:
    it = iter(ds)
    try:
        return list(it)
    finally:
        it.close()


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_provenance_names_exactly_the_records_each_step_holds(name: str) -> None:
    ds = PIPELINES[name]()
    steps = _run(ds)
    found = traced(ds, range(len(steps)))
    assert [ids_named(r) for r in found] == [ids_in(s) for s in steps]
    with pytest.raises(ProvenanceError, match=rf"step {len(steps)} is beyond the end"):
        traced(ds, [len(steps)])


@pytest.mark.parametrize("name", ["iter_filter_batch", "first_fit", "interleave_repeat_limit"])
def test_the_same_with_two_worker_processes(name: str) -> None:
    ds = PIPELINES[name]().mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    steps = _run(ds)
    it = iter(ds)
    try:
        next(it)
        assert [ids_named(r) for r in provenance(it, range(len(steps)))] == [
            ids_in(s) for s in steps
        ]
    finally:
        it.close()


def test_a_rebatch_of_arrays_names_each_record_at_the_first_row_it_fills() -> None:
    # Each input element is an array of rows from one record (as many as its tokens): a
    # batch of the rebatch holds rows of one or more records, a record's rows possibly
    # split across two batches; each record is named once per batch, at its first row.
    ds = ex.RebatchIterDataset(source(0, 12).to_iter_dataset().map(as_row), 3, drop_remainder=True)
    steps = _run(ds)
    found = traced(ds, range(len(steps)))
    assert len(found) == len(steps) == sum(1 + i % 4 for i in range(12)) // 3
    for records, step in zip(found, steps):
        rows = step["id"].tolist()
        starts = [r["offset"][0] for r in records]
        assert starts == [0] + [k for k in range(1, 3) if rows[k] != rows[k - 1]]
        assert [rows[k] for k in starts] == ids_named(records)
    with pytest.raises(ProvenanceError, match=rf"step {len(steps)} is beyond the end"):
        traced(ds, [len(steps)])


@pytest.mark.parametrize(("lengths", "why"), [((5, 7), "2 is longer"), ((7, 5), "2 is shorter")])
def test_a_strict_zip_of_streams_of_other_lengths_names_the_error_the_run_raises(
    lengths: tuple[int, int], why: str
) -> None:
    def zipped() -> chute.IterDataset[Any]:
        a, b = (source(0, n).map(ids_only).to_iter_dataset() for n in lengths)
        return ex.ZipIterDataset([a, b])

    message = rf"ZipIterDataset argument {why} than argument 1"
    with pytest.raises(ValueError, match=message):
        _run(zipped())
    assert [ids_named(r[:1]) for r in traced(zipped(), range(5))] == [[i] for i in range(5)]
    with pytest.raises(ProvenanceError, match=rf"step 5 of .* never handed out.*{message}"):
        traced(zipped(), [5])
    # A batch reads the zip in chunks: it hands out the rows before the error, then raises.
    batched = zipped().batch(2)
    assert [r["index"] for r in traced(batched, [2])[0]] == [4, 4]
    with pytest.raises(ProvenanceError, match="step 3 is beyond the end"):
        traced(batched, [3])


def packed_loader(workers: int) -> chute.DataLoader:
    """Grain's PackAndBatchOperation in a DataLoader: batches of 2 rows of 6 tokens."""
    records = [as_sequence(record(0, i)) for i in range(30)]
    return chute.DataLoader(
        data_source=records,
        sampler=chute.IndexSampler(30, shuffle=True, seed=3, num_epochs=2),
        operations=[
            ex.PackAndBatchOperation(
                length_struct={"id": 6, "t": 6}, batch_size=2, max_sequences_per_bin=2
            )
        ],
        worker_count=workers,
    )


def packed_ids(batch: tuple[Any, Any, Any]) -> list[int]:
    """The ids of a packed batch `(data, segments, positions)`, row by row."""
    return ids_in({"id": batch[0]["id"], "id_segment_ids": batch[1]["id"]})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pack_and_batch_names_each_sequence_with_its_row_and_first_token(workers: int) -> None:
    loader = packed_loader(workers)
    with iter(loader) as it:
        steps = list(it)
        found = provenance(it, range(len(steps)))
        with pytest.raises(ProvenanceError, match=rf"step {len(steps)} is beyond the end"):
            provenance(it, [len(steps)])
    assert [ids_named(r) for r in found] == [packed_ids(s) for s in steps]
    for records, (data, segments, _) in zip(found, steps):
        for r in records:
            row, token = r["offset"]
            assert data["id"][row, token] == r["index"] and segments["id"][row, token] > 0
            assert token == 0 or segments["id"][row, token - 1] != segments["id"][row, token]
    assert {r["epoch"] for r in found[-1]} == {1}


def test_a_pack_and_batch_names_a_sequence_empty_in_its_first_feature() -> None:
    # Feature "a" (the first of length_struct) is empty for every third record: those are
    # found by their tokens in "t", which hold the record's id.
    records = [
        {"a": np.zeros(0 if i % 3 == 0 else 2), "t": np.full(1 + i % 3, i)} for i in range(20)
    ]
    loader = chute.DataLoader(
        data_source=records,
        sampler=chute.IndexSampler(20, shuffle=False, num_epochs=1),
        operations=[ex.PackAndBatchOperation(length_struct={"a": 4, "t": 6}, batch_size=2)],
        worker_count=0,
    )
    with iter(loader) as it:
        steps = list(it)
        found = provenance(it, range(len(steps)))
    expected = [ids_in({"id": data["t"], "id_segment_ids": seg["t"]}) for data, seg, _ in steps]
    assert [[r["index"] for r in records_] for records_ in found] == expected
    assert any(i % 3 == 0 for ids in expected for i in ids)


SKIPPED_OVER = ["flat_map_map", "flat_map_iter", "rebatch", "rebatch_packed_rows",
                "select_from_datasets", "zip_iter_strict", "pack_and_batch"]  # fmt: skip


@pytest.mark.parametrize("name", SKIPPED_OVER)
def test_skip_over_these_stages_equals_consuming(name: str) -> None:
    def build() -> Any:
        return packed_loader(0) if name == "pack_and_batch" else PIPELINES[name]()

    def canon(x: Any) -> Any:
        return packed_ids(x) if name == "pack_and_batch" else ids_in(x)

    steps = [canon(x) for x in _run(build())]
    for n in (0, 1, len(steps) // 2, len(steps)):
        with iter(build()) as it:
            start = it.get_state()
            assert skip(it, n) == n
            assert [canon(x) for x in it] == steps[n:]
        moved = ex.skip_state(start, n, dataset=build())
        with iter(build()) as it:
            it.set_state(moved)
            assert [canon(x) for x in it] == steps[n:]


def test_records_show_the_epoch_and_the_offset_in_the_step() -> None:
    ds = source(0, 10).seed(0).shuffle().repeat(3).map(ids_only).batch(4).to_iter_dataset()
    (records,) = traced(ds, [5])  # elements 20..23: epoch 2
    assert [r["epoch"] for r in records] == [2, 2, 2, 2]
    assert [r["offset"] for r in records] == [(0,), (1,), (2,), (3,)]
    assert {r["source"] for r in records} == {None}
    packed = traced(PIPELINES["concat_then_split"](), [3])[0]
    assert [r["offset"][0] for r in packed] == sorted(r["offset"][0] for r in packed)


def test_an_index_pipeline_runs_none_of_the_users_functions() -> None:
    calls: list[Any] = []

    def counted(x: Any) -> Any:
        calls.append(x)
        return x

    ds = (
        chute.MapDataset.range(10**9)
        .map(counted)
        .seed(5)
        .shuffle()
        .repeat()
        .batch(64)
        .to_iter_dataset()
        .map(counted)
    )
    records = traced(ds, [10**6, 10**6 + 1])
    assert calls == []
    assert [len(r) for r in records] == [64, 64]
    with iter(ds) as it:
        skip(it, 10**6)
        assert [r["index"] for r in records[0]] == next(it).tolist()


def test_a_filter_computes_what_is_below_it_and_nothing_above() -> None:
    below: list[Any] = []
    above: list[Any] = []

    def seen_below(x: Any) -> Any:
        below.append(x)
        return x

    def seen_above(x: Any) -> Any:
        above.append(x)
        return x

    ds: chute.IterDataset[Any] = chute.MapDataset.range(100).map(seen_below).to_iter_dataset()
    ds = ds.filter(lambda x: x % 2).map(seen_above).batch(5)
    (records,) = traced(ds, [3])
    assert [r["index"] for r in records] == [31, 33, 35, 37, 39]
    # The maps above the filter never run; below it, the elements up to the step's last
    # (the reader may compute a chunk ahead, as it does in a run).
    assert above == [] and set(range(40)) <= set(below)


def test_steps_count_from_the_start_whatever_the_position() -> None:
    ds = PIPELINES["iter_filter_batch"]()
    with iter(ds) as it:
        for _ in range(4):
            next(it)
        assert provenance(it, range(6)) == traced(ds, range(6))
        assert provenance(it.get_state(), 2, dataset=ds) == traced(ds, [2])


def test_from_a_state_a_checkpoint_file_and_a_state_dict(tmp_path: Path) -> None:
    ds = PIPELINES["shuffle_repeat_batch"]()
    expected = traced(ds, range(3, 6))
    with iter(ds) as it:
        next(it)
        path = tmp_path / "data.json"
        chute.checkpoint.save(path, it)
        state = json.loads(path.read_text())["state"]
        assert provenance(state, range(3, 6), dataset=ds) == expected
        assert provenance(it.state_dict(), range(3, 6), dataset=ds) == expected
        assert provenance(it.get_state(), range(3, 6), dataset=ds) == expected


def test_a_state_of_another_pipeline_is_refused() -> None:
    ds = PIPELINES["shuffle_repeat_batch"]()
    other = source(0, 30).seed(2).shuffle().repeat(2).map(ids_only).batch(4).to_iter_dataset()
    with iter(ds) as it:
        state = it.get_state()
    with pytest.raises(chute.CheckpointError, match=r"seed|params|pipeline"):
        provenance(state, [0], dataset=other)
    with pytest.raises(ValueError, match=r"give the pipeline it came from.*dataset=ds"):
        provenance(state, [0])


@pytest.mark.parametrize("bad", [-1, [3, -2], True, 1.5])
def test_a_bad_step_is_refused_naming_the_rule(bad: Any) -> None:
    ds = PIPELINES["map_mix"]()
    with pytest.raises((ValueError, TypeError), match=r"steps are ints >= 0|step \(an int\)"):
        traced(ds, bad)


class RunningSum(chute.DatasetIterator[int]):
    def __init__(self, parent: chute.DatasetIterator[int]) -> None:
        super().__init__(parent)
        self._parent = parent
        self._total = 0

    def __next__(self) -> int:
        self._total += next(self._parent)
        return self._total

    def get_state(self) -> dict[str, Any]:
        return {"total": self._total, "parent": self._parent.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._total = state["total"]


class RunningSumDataset(chute.IterDataset[int]):
    def __init__(self, parent: chute.IterDataset[int]) -> None:
        super().__init__([parent])
        self._parent = parent

    def __iter__(self) -> RunningSum:
        return RunningSum(iter(self._parent))


class PairsDataset(RunningSumDataset):
    """Declares where its elements come from: element k sums parent elements 0..k."""

    def _origins(self, position: int, tracer: Any) -> list[ex.Origin]:
        return [ex.Origin(0, j, (j,)) for j in range(position + 1)]


def test_a_user_stage_that_cannot_say_where_its_elements_came_from_is_named() -> None:
    ds = RunningSumDataset(chute.MapDataset.range(10).to_iter_dataset()).batch(2)
    with pytest.raises(
        ProvenanceError, match=r"RunningSumDataset.*cannot say.*declare `_origins\(self, position"
    ):
        traced(ds, [1])
    declared = PairsDataset(chute.MapDataset.range(10).to_iter_dataset())
    assert [r["index"] for r in traced(declared, [3])[0]] == [0, 1, 2, 3]


def test_record_files_name_the_file_shard_and_record(tmp_path: Path) -> None:
    paths = []
    for k in range(3):
        p = tmp_path / f"part-{k}.jsonl"
        p.write_text("".join(json.dumps({"id": 100 * k + i}) + "\n" for i in range(4)))
        paths.append(str(p))
    records_ds = chute.MapDataset.source(chute.sources.JsonlDataSource(paths)).seed(1).shuffle()
    ds = records_ds.to_iter_dataset().batch(3)
    steps = _run(ds)
    for records, step in zip(traced(ds, range(len(steps))), steps):
        ids = [100 * r["shard"] + r["record"] for r in records]
        assert ids == step["id"].tolist()
        assert all(r["file"] == paths[r["shard"]] for r in records)


def test_crec_and_array_record_files_name_the_file_shard_and_record(tmp_path: Path) -> None:
    from chute.records import RecordWriter
    from chute.sources import ArrayRecordDataSource, RecordFileDataSource

    crec, arrays = [], []
    for k in range(3):
        crec.append(str(tmp_path / f"part-{k}.crec"))
        with RecordWriter(crec[-1]) as w:
            for i in range(3 + k):
                w.write(b"%d" % (100 * k + i))
        pytest.importorskip("array_record")
        from array_record.python import array_record_module

        arrays.append(str(tmp_path / f"part-{k}.array_record"))
        writer = array_record_module.ArrayRecordWriter(arrays[-1], "group_size:1")
        for i in range(3 + k):
            writer.write(b"%d" % (100 * k + i))
        writer.close()
    for src in (RecordFileDataSource(crec), ArrayRecordDataSource(arrays)):
        ds = chute.MapDataset.source(src).seed(2).shuffle().to_iter_dataset()
        steps = _run(ds)
        for (r,), value in zip(traced(ds, range(len(steps))), steps):
            assert int(value) == 100 * r["shard"] + r["record"]
            assert r["file"] in (crec if src.__class__ is RecordFileDataSource else arrays)


def mixture() -> chute.IterDataset[Any]:
    a = source(0, 100).to_iter_dataset()
    b = source(1000, 200).to_iter_dataset()
    return chute.IterDataset.mix({"a": a, "b": b}, {"a": 1, "b": 1}).map(ids_only).batch(2)


def test_weights_set_at_run_time_are_drawn_with_from_the_iterator_or_its_state() -> None:
    ds = mixture()
    with iter(ds) as it:
        steps = []
        for k in range(30):
            if k in (5, 12, 20):
                weights = {5: {"a": 1, "b": 3}, 12: {"a": 0, "b": 1}, 20: {"a": 2, "b": 1}}[k]
                ex.set_mix_weights(it, weights)
            steps.append(ids_in(next(it)))
        found = provenance(it, range(30))
        state = it.get_state()
    assert [ids_named(r) for r in found] == steps
    assert provenance(state, range(30), dataset=mixture()) == found
    assert {r["source"] for r in found[15]} == {"b"}  # a's weight was 0 from step 12


def test_weights_set_at_run_time_under_a_mix_of_mixes_are_read_by_mixture() -> None:
    inner = chute.IterDataset.mix([source(0, 50).to_iter_dataset()] * 2)
    ds = chute.IterDataset.mix([inner, source(1000, 50).to_iter_dataset()])
    with iter(ds) as it:
        assert provenance(it, [0]) == traced(ds, [0])  # no weights set: the built ones
        (outer,) = it.children()  # the outer mixture's own iterator
        outer.set_weights([0, 1])  # type: ignore[attr-defined]
        step = next(it)
        (record,) = provenance(it, [0])[0]
    assert record["source"] == 1 and 1000 + record["index"] == step["id"]


# -- two mixtures, each given weights at run time ------------------------------------------
# `provenance` reads each mixture's changes from its own iterator (`changes_by_mixture`).


def mixtures_of(it: Any) -> list[Any]:
    """The iterators below `it` whose weights can be set, depth first (`children()`)."""
    out, stack = [], [it]
    while stack:
        node = stack.pop()
        if callable(getattr(node, "set_weights", None)):
            out.append(node)
        stack.extend(reversed(node.children()))
    return out


def mix_of_mixes() -> chute.IterDataset[Any]:
    inner = chute.IterDataset.mix(
        {"a": source(0, 60).to_iter_dataset(), "b": source(1000, 60).to_iter_dataset()}
    )
    outer = chute.IterDataset.mix([inner, source(2000, 80).to_iter_dataset()], [1, 1])
    return outer.map(ids_only).batch(2)


def zipped_mixtures() -> chute.IterDataset[Any]:
    def mixture(base: int) -> chute.IterDataset[Any]:
        parts = {
            "a": source(base, 50).to_iter_dataset(),
            "b": source(base + 1000, 50).to_iter_dataset(),
        }
        return chute.IterDataset.mix(parts).map(ids_only)

    # A filter above the mixtures reads them as a stream: the replay draws as the run did.
    return ex.ZipIterDataset([mixture(0), mixture(10_000)], strict=False).filter(
        lambda x: x[0]["id"] % 5
    )


def ids_of_two(name: str, records: list[dict[str, Any]]) -> list[int]:
    if name == "mix_of_mixes":  # sources "0/a", "0/b" and 1
        bases = {"0/a": 0, "0/b": 1000, 1: 2000}
        return [bases[r["source"]] + r["index"] for r in records]
    bases = {"0/a": 0, "0/b": 1000, "1/a": 10_000, "1/b": 11_000}  # zip part / component
    return [bases[r["source"]] + r["index"] for r in records]


def ids_of_step(name: str, step: Any) -> list[int]:
    if name == "mix_of_mixes":
        return ids_in(step)
    return [int(step[0]["id"]), int(step[1]["id"])]


TWO_MIXTURES = {"mix_of_mixes": mix_of_mixes, "zipped_mixtures": zipped_mixtures}
# (step, which mixture, weights): set on that mixture's own iterator before the step.
CHANGES: dict[str, list[tuple[int, int, Any]]] = {
    "mix_of_mixes": [(3, 1, {"a": 1, "b": 4}), (5, 0, [1, 3]), (9, 1, {"a": 0, "b": 1}),
                     (12, 0, [2, 1])],
    "zipped_mixtures": [(2, 0, {"a": 0, "b": 1}), (4, 1, {"a": 3, "b": 1}),
                        (7, 0, {"a": 2, "b": 1}), (11, 1, {"a": 1, "b": 0})],
}  # fmt: skip


def run_with_changes(name: str, it: Any, steps: int) -> list[Any]:
    out = []
    for k in range(steps):
        for at, which, weights in CHANGES[name]:
            if at == k:
                mixtures_of(it)[which].set_weights(weights)
        out.append(next(it))
    return out


@pytest.mark.parametrize("name", sorted(TWO_MIXTURES))
def test_two_mixtures_with_weights_set_at_run_time_are_traced_exactly(name: str) -> None:
    from chute._src.core.provenance import changes_by_mixture, trace_steps

    ds = TWO_MIXTURES[name]()
    with iter(ds) as it:
        assert len(mixtures_of(it)) == 2
        steps = run_with_changes(name, it, 16)
        state = it.get_state()
        live = trace_steps(ds, range(16), mix_changes=changes_by_mixture(ds, it))
        assert provenance(it, range(16)) == live
    assert [ids_of_two(name, r) for r in live] == [ids_of_step(name, s) for s in steps]
    # From the state: restored into a fresh iterator, whose mixtures hold their changes.
    again = TWO_MIXTURES[name]()
    with iter(again) as fresh:
        fresh.set_state(state)
        changes = changes_by_mixture(again, fresh)
    assert trace_steps(again, range(16), mix_changes=changes) == live
    assert provenance(state, range(16), dataset=TWO_MIXTURES[name]()) == live


@pytest.mark.parametrize("name", sorted(TWO_MIXTURES))
def test_skip_over_two_mixtures_with_weights_set_at_run_time_equals_consuming(name: str) -> None:
    with iter(TWO_MIXTURES[name]()) as it:
        reference = [ids_of_step(name, s) for s in run_with_changes(name, it, 16)]
        reference += [ids_of_step(name, s) for s in it]
    last = max(at for at, _, _ in CHANGES[name])
    for n in (1, 5, 9):
        with iter(TWO_MIXTURES[name]()) as it:
            run_with_changes(name, it, last + 1)  # every change made, then skip
            state = it.get_state()
            assert skip(it, n) == n
            assert [ids_of_step(name, s) for s in it] == reference[last + 1 + n :]
        moved = ex.skip_state(state, n, dataset=TWO_MIXTURES[name]())
        with iter(TWO_MIXTURES[name]()) as it:
            it.set_state(moved)
            assert [ids_of_step(name, s) for s in it] == reference[last + 1 + n :]
