"""Connections a threaded pipeline opens to a keep-alive server at 20 ms (through
obstore's pool), and what closing the iterator and stopping the server leaves behind.

Reads `--batches` batches of 512 random 1 KiB records through the default pipeline
`MapDataset.source(src).shuffle(seed).to_iter_dataset().batch(512)` from a RangeServer
(tests/remote_helpers.py) with 20 ms per answer, counting the connections the server
accepted and the requests it answered, and every warning on the `chute` logger; then
closes the iterator and stops the server, in two orders:

- 'stop at once': the server's `with` block is left right after `it.close()`; reader
  threads still computing a chunk meet a server that is gone.
- 'join readers first': the reader threads are waited for before the server stops.

    python benchmarks/remote_connections.py [--records N] [--batches B] [--out FILE]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import chute
from _harness import dummy_s3_credentials, emit, machine
from chute import sources
from chute.records import ShardedRecordWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from remote_helpers import RangeServer

BATCH = 512


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


def _run(root: Path, n: int, batches: int, join_first: bool, seed: int) -> dict[str, Any]:
    warnings = Warnings()
    logging.getLogger("chute").addHandler(warnings)
    try:
        with RangeServer(str(root), delay_s=0.02) as server:
            options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.port}"}}
            src = sources.RecordFileDataSource("s3://bench/crec", storage_options=options)
            src.__getitems__([k * (n // 64) for k in range(64)])
            ds = chute.MapDataset.source(src).shuffle(seed=seed).to_iter_dataset()
            it = iter(ds.batch(BATCH))
            t0 = time.monotonic()
            for _ in range(batches):
                next(it)
            t_end = time.monotonic()
            during = warnings.count
            conns, gets = server.connections, server.gets
            it.close()
            if join_first:
                for t in threading.enumerate():
                    if t.name.startswith("chute-read"):
                        t.join(timeout=60)
        t_stop = time.monotonic()
        # What still runs after the server stopped ends here (an error, within the deadline).
        for t in threading.enumerate():
            if t.name.startswith("chute-read"):
                t.join(timeout=120)
        t_joined = time.monotonic()
        src.close()
    finally:
        logging.getLogger("chute").removeHandler(warnings)
    return {
        "rate": batches * BATCH / (t_end - t0),
        "connections": conns,
        "gets": gets,
        "during": during,
        "after": warnings.count - during,
        "stop_s": t_stop - t_end,
        "joined_s": t_joined - t_end,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=256_000)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    dummy_s3_credentials()
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "served"
        payload = np.random.default_rng(0).integers(0, 255, (args.records, 1024), np.uint8)
        with ShardedRecordWriter(
            root / "bench" / "crec", records_per_shard=args.records // 64
        ) as w:
            for row in payload:
                w.write(row.tobytes())
        for r in range(args.rounds):
            for join_first in (False, True):
                m = _run(root, args.records, args.batches, join_first, seed=10 * r + join_first)
                how = "join readers first" if join_first else "stop at once"
                rows.append(
                    f"{how:<20} {m['rate']:>9,.0f} {m['connections']:>11} {m['gets']:>8}"
                    f" {m['during']:>9} {m['after']:>9} {m['stop_s']:>12.2f}"
                    f" {m['joined_s']:>14.2f}"
                )
                print(rows[-1], file=sys.stderr)
    emit(
        [
            f"remote_connections: {args.records:,} records of 1 KiB (.crec, 64 shards) from a "
            f"keep-alive RangeServer at 20 ms (in this process), the default pipeline, "
            f"{args.batches} batches of {BATCH} from a fresh iterator, {args.rounds} rounds",
            f"machine: {machine()}; SHARED with other engineers' test runs",
            "",
            f"{'close, then':<20} {'rec/s':>9} {'connections':>11} {'requests':>8}"
            f" {'warnings':>9} {'after':>9} {'close+stop s':>12} {'readers done s':>14}",
            *rows,
        ],
        args.out,
    )


if __name__ == "__main__":
    main()
