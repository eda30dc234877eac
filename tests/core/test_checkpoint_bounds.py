"""Loading a checkpoint stays within bounds: sizes, counts and depth are checked before
anything is allocated, only regular files are read, and every failure is a short
`CheckpointError` naming the file and the path inside the state.

The cases that could exhaust memory or hang run in a subprocess under a 3 GiB address
space limit and a timeout, so that a regression fails the test instead of taking the
machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import chute
from chute.experimental import ElasticIterator

HEADER = '{"format": "chute.iterator_state", "version": 1, "state": '

PRELUDE = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import chute
from chute.experimental import ElasticIterator

def elastic(j, m):
    ds = chute.MapDataset.range(60).shuffle(seed=3).filter(lambda x: x % 4 != 1)
    return iter(ElasticIterator(ds, 6, chute.sharding.ShardOptions(j, m)))

def pipeline():
    return iter(chute.MapDataset.range(50).shuffle(seed=1).to_iter_dataset().batch(4))

try:
{body}
except chute.CheckpointError as e:
    print("CheckpointError:", e)
    sys.exit(0)
print("no error")
sys.exit(3)
"""


def run_bounded(body: str, timeout: float = 60) -> str:
    """Runs `body` in a fresh interpreter limited to 3 GiB; returns the CheckpointError's
    message it raised (the test fails on a hang, a crash, another error or no error)."""
    script = PRELUDE.format(body=textwrap.indent(textwrap.dedent(body), "    "))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the restore hung (no answer within {timeout} s)")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout.strip()
    assert out.startswith("CheckpointError: "), out
    return out.removeprefix("CheckpointError: ")


def pipeline() -> Any:
    return iter(chute.MapDataset.range(50).shuffle(seed=1).to_iter_dataset().batch(4))


def elastic_files(tmp_path: Path, *edits: dict[str, Any]) -> None:
    """`process_{0,1}-of-2.json` of a real two-host ElasticIterator run after 2 steps, with
    `edits[j]` applied to host j's state and the checksums removed (so only bounds can stop
    them)."""
    ds = chute.MapDataset.range(60).shuffle(seed=3).filter(lambda x: x % 4 != 1)
    for j in range(2):
        it = iter(ElasticIterator(ds, 6, chute.sharding.ShardOptions(j, 2)))
        next(it)
        next(it)
        path = tmp_path / f"process_{j}-of-2.json"
        chute.checkpoint.save(path, it)
        doc = json.loads(path.read_text())
        doc["state"].pop("checksum", None)
        doc["state"].update(edits[j])
        path.write_text(json.dumps(doc))


# -- counts from file names and from states --------------------------------------------------


def test_a_process_count_in_a_file_name_is_not_expanded(tmp_path: Path) -> None:
    (tmp_path / "process_0-of-100000000000.json").write_text("")
    msg = run_bounded(
        f"chute.checkpoint.CheckpointHandler().restore({str(tmp_path)!r}, item=elastic(0, 1))"
    )
    assert "100000000000 processes" in msg and "process_0-of-1.json" in msg


def test_a_process_count_too_long_for_an_int_is_no_crash(tmp_path: Path) -> None:
    (tmp_path / f"process_0-of-{'9' * 200}.json").write_text("")
    with pytest.raises(chute.CheckpointError, match="does not exist"):
        chute.checkpoint.CheckpointHandler().restore(tmp_path, item=pipeline())


def test_a_huge_shard_count_in_the_states_is_not_expanded(tmp_path: Path) -> None:
    elastic_files(tmp_path, {"shard_count": 10**12}, {"shard_count": 10**12})
    msg = run_bounded(
        f"chute.checkpoint.CheckpointHandler().restore({str(tmp_path)!r}, item=elastic(0, 1))"
    )
    assert "shard_count" in msg and "1000000000000" in msg
    assert "process_0-of-2.json" in msg or "states[0]" in msg


def test_a_huge_next_index_in_the_states_is_not_expanded(tmp_path: Path) -> None:
    elastic_files(tmp_path, {"stop": 10**16}, {"next_index": 10**15 + 1, "stop": 10**16})
    msg = run_bounded(
        f"chute.checkpoint.CheckpointHandler().restore({str(tmp_path)!r}, item=elastic(0, 1))"
    )
    assert "next_index" in msg and len(msg) < 1000


def test_merge_states_checks_counts_before_building_lists() -> None:
    ds = chute.MapDataset.range(60).shuffle(seed=3).filter(lambda x: x % 4 != 1)
    states = []
    for j in range(2):
        it = iter(ElasticIterator(ds, 6, chute.sharding.ShardOptions(j, 2)))
        next(it)
        states.append({k: v for k, v in it.get_state().items() if k != "checksum"})
    huge = [{**s, "shard_count": 10**12} for s in states]
    with pytest.raises(chute.CheckpointError, match=r"states\[0\]\['shard_count'\]"):
        ElasticIterator.merge_states(huge)
    far = [states[0], {**states[1], "next_index": 10**15 + 1, "stop": 10**16}]
    far = [{**s, "stop": 10**16} for s in far]
    with pytest.raises(chute.CheckpointError, match="next_index"):
        ElasticIterator.merge_states(far)


# -- what a path may be ------------------------------------------------------------------------


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    msg = run_bounded(f"chute.checkpoint.load({str(fifo)!r}, pipeline())", timeout=30)
    assert str(fifo) in msg and "not a regular file" in msg


def test_a_fifo_in_an_orbax_directory_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "process_0-of-1.json")
    msg = run_bounded(
        f"chute.checkpoint.CheckpointHandler().restore({str(tmp_path)!r}, item=pipeline())",
        timeout=30,
    )
    assert "process_0-of-1.json" in msg and "not a regular file" in msg


def test_dev_zero_is_refused_without_reading_it() -> None:
    msg = run_bounded("chute.checkpoint.load('/dev/zero', pipeline())")
    assert "/dev/zero" in msg and "not a regular file" in msg


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(chute.CheckpointError, match="not a regular file"):
        chute.checkpoint.load(tmp_path, pipeline())


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    with open(path, "wb") as f:
        f.truncate(200 << 20)  # sparse: 200 MB of zeros, no disk used
    msg = run_bounded(f"chute.checkpoint.load({str(path)!r}, pipeline())")
    assert str(path) in msg and "209715200 bytes" in msg and len(msg) < 600


# -- depth, strings, duplicate keys, bytes -----------------------------------------------------


def test_a_state_nested_100000_lists_deep_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(HEADER + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(chute.CheckpointError, match="nested more than 256 deep") as e:
        chute.checkpoint.load(path, pipeline())
    assert str(path) in str(e.value)


def test_a_state_nested_100000_lists_deep_in_memory() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    it = pipeline()
    state = it.get_state()
    with pytest.raises(chute.CheckpointError, match=r"state\[.parent.\]\[.x.\]\[0\].*256"):
        it.set_state({**state, "parent": {**state["parent"], "x": deep}})
    text = json.dumps({"stage": "batch", "x": 1})[:-1] + ', "y": ' + "[" * 100_000
    text += "]" * 100_000 + "}"
    with pytest.raises(chute.CheckpointError, match="nested more than 256 deep"):
        it.load_state_dict({"chute_state": text})
    assert next(it).shape == (4,)  # the iterator is unharmed


def test_brackets_inside_strings_are_no_nesting(tmp_path: Path) -> None:
    it = pipeline()
    next(it)
    state = {k: v for k, v in it.get_state().items() if k != "checksum"}
    path = tmp_path / "state.json"
    path.write_text(HEADER + json.dumps({**state, "params": "[{" * 2000}) + "}")
    with pytest.raises(chute.CheckpointError, match=r"\['params'\] = '\[\{\[\{.*other parameters"):
        chute.checkpoint.load(path, pipeline())
    escaped = json.dumps({**state, "params": '\\"[' * 2000})  # escaped quotes end no string
    with pytest.raises(chute.CheckpointError, match=r"\['params'\] = .*other parameters"):
        pipeline().load_state_dict({"chute_state": escaped})


def test_state_dict_bytes_that_are_not_utf8() -> None:
    it = pipeline()
    with pytest.raises(chute.CheckpointError, match=r"state_dict\['chute_state'\].*UTF-8"):
        it.load_state_dict({"chute_state": b"\xff\xfe{}"})


def test_a_100_mb_string_gives_a_short_error(tmp_path: Path) -> None:
    it = pipeline()
    state = it.get_state()
    big = "x" * 100_000_000
    with pytest.raises(chute.CheckpointError) as e:
        it.set_state({**state, "parent": {**state["parent"], "pipeline": [big]}})
    msg = str(e.value)
    assert len(msg) < 600 and "state['parent']['pipeline'][0]" in msg and "100000000" in msg
    assert "x" * 101 not in msg
    with pytest.raises(chute.CheckpointError) as e:
        it.load_state_dict({"chute_state": json.dumps({**state, "stage": big})})
    assert len(str(e.value)) < 600 and "x" * 101 not in str(e.value)
    path = tmp_path / "state.json"
    path.write_text(HEADER + json.dumps({**state, "stage": big}) + "}")
    with pytest.raises(chute.CheckpointError) as e:
        chute.checkpoint.load(path, it)
    assert len(str(e.value)) < 600 and str(path) in str(e.value)


def test_a_long_key_gives_a_short_error() -> None:
    it = pipeline()
    state = it.get_state()
    with pytest.raises(chute.CheckpointError, match=r"state\['parent'\] has a key of 2000000") as e:
        it.set_state({**state, "parent": {**state["parent"], "k" * 2_000_000: 1}})
    assert len(str(e.value)) < 600


@pytest.mark.parametrize(
    "edit",
    [
        {"stage": "y" * 5000},  # a foreign stage
        {"params": "y" * 5000},  # other parameters
        {"bogus": "y" * 5000},  # another key
    ],
)
def test_values_are_quoted_to_about_100_characters(edit: dict[str, Any]) -> None:
    it = pipeline()
    state = {k: v for k, v in it.get_state().items() if k != "checksum"}
    with pytest.raises(chute.CheckpointError) as e:
        it.set_state({**state, **edit})
    assert "y" * 101 not in str(e.value) and len(str(e.value)) < 1000, str(e.value)


def test_a_long_list_where_an_int_belongs_is_quoted_short() -> None:
    it = pipeline()
    state = {k: v for k, v in it.get_state().items() if k != "checksum"}
    parent = {**state["parent"], "next_index": list(range(1_000_000))}
    with pytest.raises(chute.CheckpointError, match=r"state\['parent'\]\['next_index'\]") as e:
        it.set_state({**state, "parent": parent})
    assert len(str(e.value)) < 1000


def test_duplicate_keys_are_rejected(tmp_path: Path) -> None:
    it = pipeline()
    next(it)
    state = {k: v for k, v in it.get_state().items() if k != "checksum"}
    inner = json.dumps(state["parent"])
    dup = inner[:-1] + ', "next_index": 0}'
    text = json.dumps({**state, "parent": "@"}).replace('"@"', dup)
    path = tmp_path / "state.json"
    path.write_text(HEADER + text + "}")
    with pytest.raises(chute.CheckpointError, match=r"state\['parent'\].*'next_index'.*twice") as e:
        chute.checkpoint.load(path, pipeline())
    assert str(path) in str(e.value)
    with pytest.raises(chute.CheckpointError, match=r"'next_index'.*twice"):
        pipeline().load_state_dict({"chute_state": text})
    top = HEADER + json.dumps(state) + ', "state": {}}'
    path.write_text(top)
    with pytest.raises(chute.CheckpointError, match=r"'state'.*twice"):
        chute.checkpoint.load(path, pipeline())


def test_bounded_loading_still_restores_real_checkpoints(tmp_path: Path) -> None:
    it = pipeline()
    next(it)
    path = tmp_path / "state.json"
    chute.checkpoint.save(path, it)
    expected = [b.tolist() for b in it]
    assert [b.tolist() for b in chute.checkpoint.load(path, pipeline())] == expected


# -- states of tens of millions of values ------------------------------------------------------


def _peak_and_message(body: str) -> tuple[str, int]:
    """Runs `body` (which must raise CheckpointError) in a fresh interpreter; returns the
    message and the process's peak resident memory in bytes (VmHWM, in kB)."""
    script = PRELUDE.replace(
        'print("CheckpointError:", e)',
        # VmHWM: this process's own peak (ru_maxrss would carry the parent's across exec).
        'hwm = [x for x in open("/proc/self/status") if x.startswith("VmHWM")][0]\n'
        '    print("peak:", hwm.split()[1])\n'
        '    print("CheckpointError:", e)',
    ).format(body=textwrap.indent(textwrap.dedent(body), "    "))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    peak, message = done.stdout.strip().split("\n", 1)
    assert message.startswith("CheckpointError: "), done.stdout
    return message.removeprefix("CheckpointError: "), int(peak.split()[1]) * 1024


TEN_MILLION = 10_000_000


def test_a_file_holding_ten_million_values_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    it = pipeline()
    next(it)
    chute.checkpoint.save(path, it)
    doc = json.loads(path.read_text())
    doc["state"].pop("checksum")  # crafted: only the bounds can stop it
    doc["state"]["x"] = [0] * TEN_MILLION  # 20 MB of text, under the size limit
    path.write_text(json.dumps(doc))
    msg, peak = _peak_and_message(f"chute.checkpoint.load({str(path)!r}, pipeline())")
    assert str(path) in msg and "values or more" in msg and len(msg) < 1000, msg
    assert peak < 1 << 30, peak


def test_an_elastic_state_with_ten_million_pending_indices_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    elastic_files(tmp_path, {"pending": [1] * TEN_MILLION}, {})
    msg, peak = _peak_and_message(
        f"chute.checkpoint.CheckpointHandler().restore({str(tmp_path)!r}, item=elastic(0, 1))"
    )
    assert "process_0-of-2.json" in msg and "values or more" in msg, msg
    assert peak < 1 << 30, peak


def test_a_state_in_memory_with_ten_million_values_is_refused_by_its_path() -> None:
    it = pipeline()
    state = it.get_state()
    state = {**state, "parent": {**state["parent"], "x": list(range(TEN_MILLION))}}
    with pytest.raises(
        chute.CheckpointError, match=r"state\['parent'\]\['x'\] has 10000000 values"
    ):
        it.set_state(state)


def test_a_merge_refused_for_a_far_next_index_names_the_files(tmp_path: Path) -> None:
    elastic_files(tmp_path, {"stop": 10**16}, {"next_index": 10**15 + 1, "stop": 10**16})
    msg = run_bounded(
        f"chute.checkpoint.CheckpointHandler().restore({str(tmp_path)!r}, item=elastic(0, 1))"
    )
    far = str(tmp_path / "process_1-of-2.json")
    assert f"{far!r}: state at {10**15 + 1}" in msg and "next_index" in msg, msg
    assert str(tmp_path / "process_0-of-2.json") in msg and len(msg) < 1000, msg


def test_a_merge_refused_for_a_bad_field_names_the_file(tmp_path: Path) -> None:
    elastic_files(tmp_path, {}, {"shard_count": 10**12})
    msg = run_bounded(
        f"chute.checkpoint.CheckpointHandler().restore({str(tmp_path)!r}, item=elastic(0, 1))"
    )
    assert str(tmp_path / "process_1-of-2.json") in msg and "shard_count" in msg, msg
