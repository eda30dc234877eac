"""`chute.checkpoint.save`/`load` (atomic JSON files) and `state_dict`/`load_state_dict`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import chute


def pipeline(seed: int = 1) -> chute.IterDataset[Any]:
    return (
        chute.MapDataset.range(50)
        .shuffle(seed=seed)
        .to_iter_dataset()
        .filter(lambda x: x % 3 != 0)
        .batch(4)
    )


def rest(it: Any) -> list[list[int]]:
    return [b.tolist() for b in it]


def test_save_then_load_continues_exactly(tmp_path: Path) -> None:
    it = iter(pipeline())
    for _ in range(3):
        next(it)
    path = tmp_path / "data.json"
    chute.checkpoint.save(path, it)
    expected = rest(it)
    restored = chute.checkpoint.load(str(path), iter(pipeline()))
    assert rest(restored) == expected
    doc = json.loads(path.read_text())
    assert doc["format"] == "chute.iterator_state" and doc["version"] == 1
    assert doc["state"] == json.loads(json.dumps(doc["state"]))  # plain JSON
    assert sorted(os.listdir(tmp_path)) == ["data.json"]  # no temporary file left


def test_save_replaces_atomically_and_leaves_no_temp_on_failure(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    it = iter(pipeline())
    chute.checkpoint.save(path, it)
    before = path.read_text()

    class Broken:
        def get_state(self) -> Any:
            return {"x": object()}  # not JSON: the write fails before the replace

    with pytest.raises(TypeError):
        chute.checkpoint.save(path, Broken())  # type: ignore[arg-type]
    assert path.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["data.json"]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, r"does not exist: give the path a checkpoint was saved to"),
        ('{"format": "chute.iterator_state", "vers', r"not JSON .*use an earlier checkpoint"),
        ("[1, 2]", r"its format is 'list', not 'chute.iterator_state'"),
        ('{"stage": "batch", "parent": {}}', r"its format is None, not 'chute\.iterator_state'"),
        ('{"format": "chute.iterator_state", "version": 99, "state": {}}', r"version 99"),
        (b"\xff\xfe\x00", r"cannot be read as a chute checkpoint"),
    ],
)
def test_bad_files_name_the_path_and_the_fix(
    tmp_path: Path, content: str | bytes | None, match: str
) -> None:
    path = tmp_path / "data.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    it = iter(pipeline())
    next(it)
    before = it.get_state()
    with pytest.raises(chute.CheckpointError, match=match) as info:
        chute.checkpoint.load(path, it)
    assert str(path) in str(info.value)
    assert it.get_state() == before


def test_a_file_of_another_pipeline_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    chute.checkpoint.save(path, iter(pipeline(seed=1)))
    it = iter(pipeline(seed=2))
    before = it.get_state()
    with pytest.raises(chute.CheckpointError, match=r"data\.json. does not fit this pipeline") as e:
        chute.checkpoint.load(path, it)
    assert "in the state, but this pipeline has" in str(e.value)  # the first difference
    assert it.get_state() == before


def test_state_dict_is_one_json_string_and_round_trips() -> None:
    it = iter(pipeline())
    next(it)
    sd = it.state_dict()
    assert list(sd) == ["chute_state"] and isinstance(sd["chute_state"], str)
    expected = rest(it)
    fresh = iter(pipeline())
    fresh.load_state_dict(sd)
    assert rest(fresh) == expected
    with pytest.raises(chute.CheckpointError, match="expected a dict with the one key"):
        fresh.load_state_dict(it.get_state())
    with pytest.raises(chute.CheckpointError, match="is not JSON"):
        fresh.load_state_dict({"chute_state": "{"})


def test_importing_chute_imports_neither_orbax_nor_jax_nor_torch() -> None:
    code = (
        "import sys, chute, chute.checkpoint\n"
        "it = iter(chute.MapDataset.range(3).to_iter_dataset()); it.state_dict()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('orbax', 'jax', 'torch')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
