"""Resumable JSONL and multi-file line streams: each file is a shard whose state is a byte
offset; the files are merged by the interleave rule; restore seeks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import chute
from chute.experimental import FileLinesIterDataset, InterleaveIterDataset, JsonlIterDataset
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


def _write(tmp_path: Path, counts: list[int]) -> list[Path]:
    paths = []
    for f, n in enumerate(counts):
        path = tmp_path / f"part-{f:02d}.jsonl"
        lines = [json.dumps({"file": f, "row": r, "text": "é" * r}) for r in range(n)]
        path.write_text("\n".join(lines) + ("\n" if n % 2 else ""), encoding="utf-8")
        paths.append(path)
    return paths


def test_reads_every_line_of_every_file_in_order(tmp_path: Path) -> None:
    _write(tmp_path, [3, 0, 4, 1])
    rows = list(JsonlIterDataset(str(tmp_path / "*.jsonl")))
    assert [(r["file"], r["row"]) for r in rows] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (2, 0),
        (2, 1),
        (2, 2),
        (2, 3),
        (3, 0),
    ]
    lines = list(FileLinesIterDataset([tmp_path / "part-03.jsonl"]))
    assert lines == ['{"file": 3, "row": 0, "text": ""}']


def test_state_is_file_and_offset_and_restore_seeks(tmp_path: Path) -> None:
    paths = _write(tmp_path, [5, 2, 6])
    ds = JsonlIterDataset([str(p) for p in paths])
    assert_equal_output_after_checkpoint(ds)
    assert_equal_output_after_checkpoint(ds.batch(2, batch_fn=list))
    it = iter(ds)
    for _ in range(6):
        next(it)
    state = it.get_state()
    assert isinstance(state.pop("checksum"), str)  # of the values below (state_checks)
    # File 1 is open in the one slot of the cycle; its first read started at byte 0 and
    # one line of it was handed out.
    assert state == {
        "stage": "interleave",
        "cycle_pos": 0,
        "next_input": 2,
        "slots": [{"input": 1, "skip": 1, "parent": {"stage": "file_lines", "offset": 0}}],
    }
    # Restoring does not read the lines before the offset: corrupt them and it still works.
    paths[0].write_text("not json\n" * 5)
    fresh = iter(JsonlIterDataset([str(p) for p in paths]))
    fresh.set_state(json.loads(json.dumps(state)))
    assert [(r["file"], r["row"]) for r in fresh] == [
        (1, 1),
        (2, 0),
        (2, 1),
        (2, 2),
        (2, 3),
        (2, 4),
        (2, 5),
    ]


def test_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(chute.DataError, match=r"line at byte 9 of .*bad.jsonl cannot be parsed"):
        list(JsonlIterDataset(bad))
    with pytest.raises(FileNotFoundError, match="matches no file"):
        JsonlIterDataset(str(tmp_path / "*.missing"))
    it = iter(JsonlIterDataset(bad))

    def state(input: int, offset: int, next_input: int = 1) -> dict[str, Any]:
        slot = {"input": input, "skip": 0, "parent": {"stage": "file_lines", "offset": offset}}
        return {
            "stage": "interleave",
            "cycle_pos": 0,
            "next_input": next_input,
            "slots": [slot],
        }

    with pytest.raises(chute.CheckpointError, match=r"\['next_input'\] = 2 is invalid.* of the 1"):
        it.set_state(state(1, 0, next_input=2))
    with pytest.raises(chute.CheckpointError, match=r"\['offset'\] = 999 is past the end"):
        it.set_state(state(0, 999))
    with pytest.raises(chute.CheckpointError, match=r"\['offset'\] = 3 is not the start of a"):
        it.set_state(state(0, 3))


def _interleaved(paths: list[Path], workers: int) -> chute.IterDataset[Any]:
    files = [JsonlIterDataset(str(p)) for p in paths]
    ds = InterleaveIterDataset(files, cycle_length=3, iter_buffer_size=2)
    shuffled = chute.experimental.WindowShuffleIterDataset(ds, window_size=5, seed=1)
    mixed = chute.IterDataset.mix(
        [
            shuffled,
            chute.MapDataset.range(100).map(lambda i: {"file": -1, "row": i}).to_iter_dataset(),
        ]
    )
    return mixed.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))


def test_seed_004_interleaved_files_restore_and_worker_counts(tmp_path: Path) -> None:
    paths = _write(tmp_path, [4, 7, 1, 5, 3, 6])
    out = list(_interleaved(paths, 0))
    assert sorted((r["file"], r["row"]) for r in out if r["file"] >= 0) == sorted(
        (f, r) for f, n in enumerate([4, 7, 1, 5, 3, 6]) for r in range(n)
    )
    assert_trees_equal(list(_interleaved(paths, 3)), out)
    assert_equal_output_after_checkpoint(
        _interleaved(paths, 0), restore_into=_interleaved(paths, 3), steps=[0, 1, 13, 30, 52]
    )
