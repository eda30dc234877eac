"""Shared helpers for the benchmark scripts: timing, machine info, a plain table."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


def shared_data() -> Path:
    """`shared/data` beside the checkout (override with CHUTE_SHARED_DATA)."""
    env = os.environ.get("CHUTE_SHARED_DATA")
    if env:
        return Path(env)
    for parent in Path(__file__).resolve().parents:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    raise SystemExit("shared/data not found beside the checkout: set CHUTE_SHARED_DATA")


def machine() -> str:
    # Imported here, not with the module: benchmark scripts import this module, and the
    # forkserver imports the main script, so its imports would be counted in the workers'
    # start-up (importlib.metadata: ~13 ms).
    import importlib.metadata

    versions = []
    for pkg in ("chute", "grain", "numpy", "torch", "array-record", "tokenizers"):
        try:
            versions.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}; "
        + ", ".join(versions)
    )


def rate(run: Callable[[], int], repeats: int = 3) -> float:
    """Best-of-`repeats` items/s of `run`, which returns how many items it processed."""
    return rates({"run": run}, repeats)["run"]


def rates(runs: dict[str, Callable[[], int]], repeats: int = 3) -> dict[str, float]:
    """Best-of-`repeats` items/s of each run, the runs interleaved round by round.

    Interleaving means a burst of load from elsewhere on a shared machine hits every
    contender in that round, rather than skewing one of them: compare ratios, not absolutes.
    """
    best = dict.fromkeys(runs, 0.0)
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            n = run()
            best[name] = max(best[name], n / (time.perf_counter() - t0))
    return best


def count_elements(batches: Iterable[object]) -> int:
    n = 0
    for b in batches:
        n += len(b)  # type: ignore[arg-type]
    return n


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, sep, *body])


@contextlib.contextmanager
def object_servers(root: Path, latencies_ms: list[float]) -> Iterator[list[int]]:
    """Ports of servers over the files under `root` (`/bucket/key` is `root/bucket/key`),
    run in a process of their own (tests/remote_helpers.py): moto's S3 server (files are
    uploaded to it), a latency proxy in front of it per entry of `latencies_ms`, then a
    keep-alive range server per entry. Stopped when the block ends."""
    helper = Path(__file__).resolve().parents[1] / "tests" / "remote_helpers.py"
    server = subprocess.Popen(
        [sys.executable, str(helper), f"--root={root}", *map(str, latencies_ms)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    try:
        yield [int(p) for p in server.stdout.readline().split()]
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def emit(lines: list[str], out: Path | None) -> None:
    """Prints a benchmark's result lines, and writes them to `out` when given."""
    text = "\n".join(lines)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def compile_chute() -> str:
    """Writes chute's bytecode, as `pip install` does for an installed package (torch and
    the other peers are installed so). An editable checkout run with
    PYTHONDONTWRITEBYTECODE set would otherwise compile chute's modules from source in
    every fresh process, worker processes included. Returns a line for the results."""
    import compileall

    import chute

    root = Path(chute.__file__).parent
    compileall.compile_dir(str(root), quiet=1)
    return f"chute's bytecode compiled in {root} (as pip install does)"


def dummy_s3_credentials() -> None:
    """Credentials for the local test servers (which check none), unless set already."""
    for k, v in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
