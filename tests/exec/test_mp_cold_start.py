"""While the workers of a program's first pool start (the forkserver imports numpy, chute
and the modules the pipeline refers to), the consumer computes the elements it asks for itself, on a helper
thread; the output, and how failures, unpicklable elements and hangs are reported, stay
those of the workers. Each case runs a real script in a fresh interpreter, where the
forkserver is cold."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

from chute._src.exec.workers.startup import StartupHelper
from process_helpers import run_python

# A module of the user's that the pipeline refers to: the forkserver imports it, as it
# would a tokenizer's or torch's, and with SLOW_SERVER it takes as long as torch does.
SLOW_MODULE = """
import os, sys, time

forkserver = "multiprocessing.forkserver import main" in " ".join(sys.orig_argv)
if forkserver and os.environ.get("SLOW_SERVER"):
    time.sleep(4)


def passthrough(x):
    return x
"""

SCRIPT = """
import json, os, sys, threading, time
import chute
import slow_module


def tag(x):
    return x, os.getpid()


def fail_at_5(x):
    if x == 5:
        raise ValueError("cannot handle 5")
    return x, os.getpid()


def lock_at_5(x):
    return threading.Lock() if x == 5 else (x, os.getpid())


def sleep_at_5(x):
    if x == 5:
        time.sleep(8)
    return x, os.getpid()


def costly(x):
    time.sleep(float(os.environ["COST_S"]))
    return x, os.getpid()


def init(worker_index, num_workers):
    pass


class Recorded:  # records 0..n-1; notes, in the process that built it, each read's size

    def __init__(self, n):
        self.n, self.owner, self.reads = n, os.getpid(), []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.__getitems__([i])[0]

    def __getitems__(self, indices):
        if os.getpid() == self.owner:
            self.reads.append(len(indices))
        return [int(i) for i in indices]


class Cold:  # a source whose first read in each worker takes 0.3 s, as a lazy load does
    def __init__(self, n):
        self.n, self.owner, self.loaded = n, os.getpid(), False

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.__getitems__([i])[0]

    def __getitems__(self, indices):
        if os.getpid() != self.owner and not self.loaded:
            self.loaded = True
            time.sleep(0.3)
        time.sleep(0.0001 * len(indices))
        return [(int(i), len(indices), os.getpid()) for i in indices]


def run(fn, init_fn=None, **options):
    opts = chute.MultiprocessingOptions(num_workers=2, **options)
    ds = chute.MapDataset.range(int(os.environ.get("COUNT", 64))).map(slow_module.passthrough).map(fn).to_iter_dataset().mp_prefetch(opts, init_fn)
    got, error = [], None
    it = iter(ds)
    try:
        for x in it:
            got.append(x)
    except Exception as e:
        error = {"type": type(e).__name__, "text": str(e),
                 "notes": "\\n".join(getattr(e, "__notes__", []))}
    finally:
        it.close()
    here = [x for x, pid in got if pid == os.getpid()]
    return {"values": [x for x, _ in got], "here": here, "error": error}


if __name__ == "__main__":
    case = sys.argv[1]
    if case == "cheap":
        out = {"first": run(tag), "second": run(tag)}
    elif case == "init":
        out = run(tag, init)
    elif case == "costly":
        out = run(costly)
    elif case == "runs":
        source = Recorded(int(os.environ["COUNT"]))
        opts = chute.MultiprocessingOptions(num_workers=2)
        ds = chute.MapDataset.source(source).map(slow_module.passthrough)
        it = iter(ds.to_iter_dataset().mp_prefetch(opts))
        out = {"values": list(it), "reads": source.reads}
        it.close()
    elif case == "cold":
        source = Cold(int(os.environ["COUNT"]))
        opts = chute.MultiprocessingOptions(num_workers=2)
        it = iter(chute.MapDataset.source(source).to_iter_dataset().mp_prefetch(opts))
        got = list(it)
        it.close()
        reads, pos = [], 0  # (pid, size) of each read, in index order
        while pos < len(got):
            _, size, pid = got[pos]
            reads.append((pid, size))
            pos += size
        out = {"values": [i for i, _, _ in got], "reads": reads, "me": os.getpid()}
    elif case == "sleep":
        out = run(sleep_at_5, stall_warning_s=30, timeout_s=2)
        start = time.monotonic()
        while any(t.name == "chute-startup" for t in threading.enumerate()):
            time.sleep(0.1)
        out["helper_ended_after_s"] = time.monotonic() - start
    else:
        out = run({"fail": fail_at_5, "lock": lock_at_5}[case])
    print(json.dumps(out))
"""


def run(folder: Path, case: str, **env: str) -> dict:
    (folder / "job.py").write_text(SCRIPT)
    (folder / "slow_module.py").write_text(SLOW_MODULE)
    done = run_python(folder, [str(folder / "job.py"), case], {**os.environ, **env}, cwd=folder)
    return json.loads(done.stdout.splitlines()[-1])


def test_the_first_pool_computes_elements_here_while_its_workers_start(tmp_path: Path) -> None:
    out = run(tmp_path, "cheap")
    first, second = out["first"], out["second"]
    assert first["values"] == second["values"] == list(range(64))
    assert first["error"] is None and second["error"] is None
    # The cheap elements asked for while the forkserver imports are computed here, in order
    # from the first; the last is always the workers' (so that they report what they can't).
    assert len(first["here"]) > 1 and first["here"] == list(range(len(first["here"])))
    assert 63 not in first["here"]
    # The second pool's workers start with a fork: only its first element is computed here.
    assert second["here"] == [0]


def test_a_worker_init_fn_leaves_every_element_but_the_first_to_the_workers(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, "init")
    assert out["values"] == list(range(64)) and out["here"] == [0]


def test_an_element_that_fails_here_is_reported_by_a_worker(tmp_path: Path) -> None:
    out = run(tmp_path, "fail")
    assert out["values"] == [0, 1, 2, 3, 4]
    error = out["error"]
    assert error["type"] == "ValueError" and error["text"] == "cannot handle 5"
    assert "at element index 5\n" in error["notes"] + "\n", error["notes"]
    assert "raised in worker" in error["notes"], error["notes"]


def test_an_unpicklable_element_is_named_by_the_workers(tmp_path: Path) -> None:
    out = run(tmp_path, "lock")
    assert out["values"] == [0, 1, 2, 3, 4]
    assert out["error"]["type"] == "TypeError"
    assert "the element at index 5 cannot be pickled" in out["error"]["notes"]


def test_an_element_that_outlasts_the_start_times_out_in_a_worker(tmp_path: Path) -> None:
    out = run(tmp_path, "sleep")
    assert out["values"] == [0, 1, 2, 3, 4]
    assert out["error"]["type"] == "WorkerTimeoutError", out["error"]
    assert "timeout_s=2" in out["error"]["text"]
    # The helper thread was left to finish the element; it ends when the element returns.
    assert out["helper_ended_after_s"] < 8


def test_costly_elements_are_computed_here_while_a_slow_forkserver_starts(
    tmp_path: Path,
) -> None:
    # The server imports a module that takes 4 s to import: once it has been starting
    # for twice as long as an element takes, the helper computes them, in order.
    out = run(tmp_path, "costly", COST_S="0.25", COUNT="24", SLOW_SERVER="1")
    assert out["values"] == list(range(24)) and out["error"] is None
    here = out["here"]
    assert len(here) >= 4 and here == list(range(len(here))), here
    assert 23 not in here


def test_the_helper_reads_runs_of_elements_that_grow_while_a_slow_forkserver_starts(
    tmp_path: Path,
) -> None:
    # One record at a time, a source is read once per record and every stage is called
    # once per element; the helper reads runs instead, growing 4-fold towards ~20 ms.
    out = run(tmp_path, "runs", COUNT="3000", SLOW_SERVER="1")
    assert out["values"] == list(range(3000))
    reads = out["reads"]
    assert reads[0] == 1  # the first element, alone
    assert max(reads) >= 256, reads
    assert all(b <= 4 * a for a, b in itertools.pairwise(reads)), reads
    assert sum(reads) < 3000  # the last element is always the workers'


def test_a_workers_slow_first_chunk_does_not_shrink_the_chunks_after_it(tmp_path: Path) -> None:
    # The workers' first chunks are sized from the helper's runs; each worker's first read
    # takes 0.3 s more (a lazy load). Sized from that one, the next chunks would shrink
    # ~15-fold and grow back 4-fold per result, a round trip each.
    out = run(tmp_path, "cold", COUNT="4000")
    assert out["values"] == list(range(4000))
    # Reads are in index order: on a loaded machine the helper may have read all but the
    # last few elements before a worker's first chunk, which then holds what was left.
    left_at: dict[int, int] = {}
    at = 0
    for pid, size in out["reads"]:
        left_at.setdefault(pid, 4000 - at)
        at += size
    for pid in set(left_at) - {out["me"]}:
        sizes = [size for p, size in out["reads"] if p == pid]
        assert sizes[0] >= min(20, left_at[pid]), sizes  # sized from the helper's runs
        assert min(sizes[1:-1], default=sizes[0]) >= sizes[0] / 5, sizes


def test_the_helper_waits_until_an_element_is_likely_done_before_the_workers_start() -> None:
    # The last element took 1 s; the server has been starting for 0.5 s: an element
    # started now would likely still run when the workers start. The helper waits, and
    # leaves the element to the workers, which start first.
    began = time.monotonic()
    helper = StartupHelper(
        started=lambda: time.monotonic() - began > 0.3,
        starting_s=lambda: 0.5 + time.monotonic() - began,
        target_s=0.02,
    )
    helper.measured(1.0, 1)
    assert helper.size(10) == 0
    assert 0.3 < time.monotonic() - began < 2
    helper.close()


def test_the_helper_starts_an_element_once_the_server_has_been_starting_long_enough() -> None:
    # Same, but the workers are still not started when the server has been starting for
    # 2 s (twice the last element's time): an element is computed here from then on.
    began = time.monotonic()
    helper = StartupHelper(
        started=lambda: False, starting_s=lambda: 1.7 + time.monotonic() - began, target_s=0.02
    )
    helper.measured(1.0, 1)
    assert helper.size(10) == 1
    assert time.monotonic() - began > 0.3
    assert helper.compute(lambda: ["done"], 1) == ["done"]
    assert helper.element_s < 0.1  # now the time that element took
    assert helper.size(10) == 4  # at once, and 4 of them: runs grow 4-fold
    helper.close()


def test_runs_computed_here_grow_to_the_target_time_and_fit_the_start() -> None:
    starting = [1.0]
    helper = StartupHelper(started=lambda: False, starting_s=lambda: starting[0], target_s=0.02)
    helper.measured(0.001, 1)  # 1 ms an element: 20 make the 20 ms target
    sizes = []
    for _ in range(4):
        k = helper.size(1000)
        sizes.append(k)
        helper.measured(0.001 * k, k)
    assert sizes == [4, 16, 20, 20]
    assert helper.size(7) == 7  # never more than asked for
    # The server has been starting for 10 ms: 5 elements of 1 ms are likely done (twice
    # their time) before the workers start; 20 would not be.
    starting[0] = 0.01
    assert helper.size(1000) == 5
    helper.close()


def test_a_run_computed_here_returns_its_elements_and_measures_them() -> None:
    helper = StartupHelper(started=lambda: False, starting_s=lambda: 10.0, target_s=0.02)

    def run() -> list[int]:
        time.sleep(0.05)
        return [1, 2, 3, 4, 5]

    assert helper.compute(run, 5) == [1, 2, 3, 4, 5]
    assert 0.009 < helper.element_s < 0.05  # 0.05 s for 5 elements
    assert helper.compute(lambda: 1 / 0, 3) is None  # raised: left to the workers
    helper.close()
