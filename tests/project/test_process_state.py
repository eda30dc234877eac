"""chute leaves the user's process as it found it (`chute._src.process_effects`).

In a fresh interpreter, the script below records the process's state, imports chute,
builds a pipeline over a `.crec` file (local, or on a real S3 server on 127.0.0.1) with 2
worker processes, iterates it to the end and closes it, then records the state again. The
two records must be equal: signal handlers (every signal, real-time ones included) and the
signal mask, rlimits, the identity of every callable of `multiprocessing` (and its
`spawn`, `context`, `forkserver`, `process`, `util` modules) and of `threading`, the
process-wide forkserver and the exit hooks of `threading`, the threads (after close, with
a bounded wait), the environment, and file leases held in `/proc/locks`. It also checks
that building the pipeline starts no process, and that no lease is held while reading.

Run it with `pytest tests/project/test_process_state.py`.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from chute.records import RecordWriter
from process_helpers import run_python

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

SCRIPT = """
import json, os, resource, signal, sys, threading, time
import multiprocessing, multiprocessing.context, multiprocessing.forkserver
import multiprocessing.process, multiprocessing.spawn, multiprocessing.util
import concurrent.futures.thread  # the standard library's own exit hook, registered before

MODULES = [
    multiprocessing, multiprocessing.context, multiprocessing.forkserver,
    multiprocessing.process, multiprocessing.spawn, multiprocessing.util, threading,
]
LIMITS = sorted(n for n in dir(resource) if n.startswith("RLIMIT_"))


def handler(sig):
    try:
        return signal.getsignal(sig)
    except (ValueError, OSError):
        return "invalid"


def leases():
    pid = os.getpid()
    with open("/proc/locks") as f:
        return sorted(line.split(":", 1)[1].strip() for line in f
                      if " LEASE " in line and f" {pid} " in line)


def children():
    out = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            out += f.read().split()
    return sorted(out)


def snapshot():
    server = multiprocessing.forkserver._forkserver  # the process-wide one, the user's
    return {
        "signals": {sig: handler(sig) for sig in range(1, signal.SIGRTMAX + 1)},
        "signal mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in LIMITS},
        "callables": {
            f"{m.__name__}.{name}": value
            for m in MODULES for name, value in vars(m).items() if callable(value)
        },
        "shared forkserver": {
            k: repr(v) for k, v in vars(server).items() if k != "_lock"
        },
        "threading exit hooks": list(getattr(threading, "_threading_atexits", [])),
        "threads": sorted(t.name for t in threading.enumerate()),
        "environment": dict(os.environ),
        "leases": leases(),
    }


def differences(before, after):
    out = {}
    for key in before:
        a, b = before[key], after[key]
        if isinstance(a, dict):
            changed = sorted(
                (k for k in a.keys() | b.keys()
                 if k not in a or k not in b or a[k] is not b[k] and a[k] != b[k]),
                key=str,
            )
            if changed:
                out[key] = [f"{k}: {a.get(k, '-')!r} -> {b.get(k, '-')!r}" for k in changed]
        elif a != b:
            out[key] = [f"{a!r} -> {b!r}"]
    return out


before = snapshot()
kids_before = children()

import chute
from chute import sources

url, options = sys.argv[1], json.loads(sys.argv[2])
src = sources.RecordFileDataSource(url, **({"storage_options": options} if options else {}))
ds = (
    chute.MapDataset.source(src)
    .map(len)
    .to_iter_dataset()
    .mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
)
started_by_building = sorted(set(children()) - set(kids_before))
it = iter(ds)
first = next(it)
held_while_reading = leases()
out = [first, *it]
it.close()
del it, ds, src

deadline = time.monotonic() + 10  # threads that end on close: a bounded wait
after = snapshot()
while differences(before, after).get("threads") and time.monotonic() < deadline:
    time.sleep(0.05)
    after = snapshot()
print(json.dumps({
    "elements": len(out),
    "sum": sum(out),
    "started by building": started_by_building,
    "leases while reading": held_while_reading,
    "differences": differences(before, after),
}))
"""

RECORDS = [bytes(range(k % 200)) * 3 for k in range(300)]


def write_crec(path: Path) -> None:
    with RecordWriter(path) as w:
        for r in RECORDS:
            w.write(r)


def check(tmp_path: Path, url: str, options: dict[str, Any] | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CHUTE_FILE_LEASES"}  # the default
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = run_python(
        tmp_path, [str(script), url, json.dumps(options or {})], env=env, cwd=tmp_path
    )
    report = json.loads(done.stdout.splitlines()[-1])
    assert (report["elements"], report["sum"]) == (len(RECORDS), sum(map(len, RECORDS)))
    # Nothing starts before iter(), no lease is held while reading, nothing is changed.
    found = {k: report[k] for k in ("started by building", "leases while reading", "differences")}
    assert found == {"started by building": [], "leases while reading": [], "differences": {}}, (
        json.dumps(found, indent=1)
    )


def test_a_local_run_leaves_the_process_as_found(tmp_path: Path) -> None:
    path = tmp_path / "data.crec"
    write_crec(path)
    check(tmp_path, str(path), None)


def test_a_remote_run_leaves_the_process_as_found(tmp_path: Path, s3_server: Any) -> None:
    path = tmp_path / "data.crec"
    write_crec(path)
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    s3_server.fs().put_file(str(path), f"{prefix}/data.crec")
    check(tmp_path, f"{prefix}/data.crec", s3_server.options)
