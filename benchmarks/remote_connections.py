"""Where the range client loses connections when a threaded pipeline reads from a
keep-alive server at 20 ms: during the run, or after the iterator is closed.

Reads `--batches` batches of 512 random 1 KiB records through the default pipeline
`MapDataset.source(src).shuffle(seed).to_iter_dataset().batch(512)` from a RangeServer
(tests/remote_helpers.py) with 20 ms per answer, counting every connection the client
loses (a reused one the server closed, a new one refused) by the time it happens, then
closes the iterator and stops the server, in two orders:

- 'stop at once': as a script that leaves the server's `with` block right after
  `it.close()`. `close()` cancels the chunks not started, but the reader threads finish
  the chunks they are computing; those fetches meet a server that is gone (its
  connections closed, new ones refused) and retry with backoff.
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
from chute._src.remote import wire
from chute.records import ShardedRecordWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from remote_helpers import RangeServer

BATCH = 512


class Losses:
    """Every connection `wire.Call` loses, with when (the method observed, not changed)."""

    def __init__(self) -> None:
        self.at: list[tuple[float, str]] = []
        self._lost = wire.Call._lost

    def __enter__(self) -> Losses:
        lost, at = self._lost, self.at

        def observed(call: wire.Call, c: wire.Conn, e: BaseException) -> None:
            at.append((time.monotonic(), "refused" if c.stage == 0 else "closed"))
            lost(call, c, e)

        wire.Call._lost = observed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        wire.Call._lost = self._lost  # type: ignore[method-assign]


class Retries(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "retry" in record.getMessage()


def _run(root: Path, n: int, batches: int, join_first: bool, seed: int) -> dict[str, Any]:
    retries = Retries()
    logging.getLogger("chute").addHandler(retries)
    try:
        with Losses() as losses:
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
                during_retries = retries.count
                it.close()
                if join_first:
                    for t in threading.enumerate():
                        if t.name.startswith("chute-read"):
                            t.join(timeout=60)
            t_stop = time.monotonic()
            # What still runs after the server stopped finishes its retries here.
            for t in threading.enumerate():
                if t.name.startswith("chute-read"):
                    t.join(timeout=60)
            src.close()
    finally:
        logging.getLogger("chute").removeHandler(retries)
    during = [k for t, k in losses.at if t <= t_end]
    after = [k for t, k in losses.at if t > t_end]
    return {
        "rate": batches * BATCH / (t_end - t0),
        "during": len(during),
        "during_retries": during_retries,
        "after_closed": after.count("closed"),
        "after_refused": after.count("refused"),
        "after_retries": retries.count - during_retries,
        "stop_s": t_stop - t_end,
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
                    f"{how:<20} {m['rate']:>9,.0f} {m['during']:>7} {m['during_retries']:>8}"
                    f" {m['after_closed']:>13} {m['after_refused']:>14}"
                    f" {m['after_retries']:>14} {m['stop_s']:>8.2f}"
                )
                print(rows[-1], file=sys.stderr)
    emit(
        [
            f"remote_connections: {args.records:,} records of 1 KiB (.crec, 64 shards) from a "
            f"keep-alive RangeServer at 20 ms (in this process), the default pipeline, "
            f"{args.batches} batches of {BATCH} from a fresh iterator, {args.rounds} rounds",
            f"machine: {machine()}; SHARED with other engineers' test runs",
            "",
            f"{'close, then':<20} {'rec/s':>9} {'lost':>7} {'retries':>8}"
            f" {'after: closed':>13} {'after: refused':>14} {'after: retries':>14}"
            f" {'close+stop s':>8}",
            *rows,
        ],
        args.out,
    )


if __name__ == "__main__":
    main()
