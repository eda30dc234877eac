"""Exit after remote reads: no abort, hang or noise. The command line is run many times
in a row against a local S3 server (moto), and scripts that stop reading a stream
part-way exit right after: every exit status 0, nothing on stderr.

The abort these catch: obstore's native threads complete its futures by taking the GIL
and calling `loop.call_soon_threadsafe`; the reader can see its result, and the program
end, while such a thread is still in there, and when the interpreter finalizes then,
Python ends that thread with `pthread_exit` through Rust frames: SIGABRT (-6), nothing
printed (5 of 30 `chute inspect s3://...` runs on a loaded machine). `loop.py` waits for
every native thread to hand its futures back before the interpreter finalizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from chute.records import RecordWriter
from process_helpers import SRC
from remote_helpers import RangeServer

pytest.importorskip("obstore", reason="needs obstore (the remote extra)")


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": SRC}
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        env.setdefault(key, value)
    return env


def _failures(runs: list[subprocess.CompletedProcess[str]]) -> list[str]:
    return [
        f"run {k}: exit {p.returncode}, stderr {p.stderr[-2000:]!r}"
        for k, p in enumerate(runs)
        if p.returncode != 0 or p.stderr
    ]


@pytest.mark.slow
def test_chute_inspect_of_s3_exits_cleanly_50_times_in_a_row(
    s3_server: Any, tmp_path: Path
) -> None:
    bucket = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    local = tmp_path / "x.crec"
    with RecordWriter(local) as w:
        for i in range(1000):
            w.write(b"record %d" % i)
    s3_server.fs().put_file(str(local), f"{bucket}/x.crec")
    args = [sys.executable, "-m", "chute.cli", "inspect", f"{bucket}/x.crec"]
    args += ["--storage-options", json.dumps(s3_server.options)]
    runs = [
        subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=120)
        for _ in range(50)
    ]
    assert not _failures(runs), "\n".join(_failures(runs))
    assert all("records:  1,000" in p.stdout for p in runs)


# Stops part-way through a stream (its read-ahead in flight, over a server that answers
# after 50 ms), and exits at once: from the main thread, or with the iterator abandoned
# on a thread of its own.
_PARTIAL = """
import sys, threading
import chute
ds = chute.experimental.JsonlIterDataset(sys.argv[1:])
its = []  # the iterators, abandoned (not closed) at exit
if "{how}" == "main":
    its.append(iter(ds))
    print([next(its[0])["i"] for _ in range({n})][-1], flush=True)
else:
    got = []
    def read():
        its.append(iter(ds))
        got.extend(next(its[0])["i"] for _ in range({n}))
    t = threading.Thread(target=read, daemon={daemon})
    t.start()
    t.join()
    print(got[-1], flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["main", "daemon-thread", "thread"])
def test_a_script_that_stops_reading_a_stream_part_way_exits_cleanly(
    tmp_path: Path, how: str
) -> None:
    root = tmp_path / "served"
    (root / "b").mkdir(parents=True)
    lines = b"".join(json.dumps({"i": i, "pad": "p" * 60}).encode() + b"\n" for i in range(40_000))
    for k in range(4):
        (root / "b" / f"{k}.jsonl").write_bytes(lines)
    script = tmp_path / "partial.py"
    script.write_text(
        textwrap.dedent(_PARTIAL).format(how=how, n=15_000, daemon=how == "daemon-thread")
    )
    with RangeServer(str(root), delay_s=0.05) as server:
        urls = [f"http://127.0.0.1:{server.port}/b/{k}.jsonl" for k in range(4)]
        runs = [
            subprocess.run(
                [sys.executable, str(script), *urls],
                capture_output=True,
                text=True,
                env=_env(),
                timeout=120,
            )
            for _ in range(5)
        ]
    assert not _failures(runs), "\n".join(_failures(runs))
    assert all(p.stdout.strip() == "14999" for p in runs)
