"""Converting the corpus with tokenization: Beam (DirectRunner, 1 and 2 worker processes)
against single-process `chute convert`, side by side in one run.

Each contender converts the JSONL corpus (built by ../shared/data/make_corpus.py) into 8
`.crec` shards, tokenizing every description with the real bert-base-uncased tokenizer
at conversion time (`--map`, the same transformation objects the online pipeline uses).
Contenders alternate round by round; the table gives the median of the rounds, in
records/s and input MB/s, and each one's ratio to single-process convert. A tiny job (100
records) gives Beam's fixed start-up cost. "CPU s" is the CPU time of the benchmark
process and of the worker processes it reaped (Beam's): on a shared machine, wall time
also depends on how much of the contended CPU each contender's processes get. Every
output is checked to hold the same records as the single-process one.

    python benchmarks/bench_beam.py [--sizes 120000 1200000] [--rounds 3 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), *sys.path) if p)

from _beam_prep import TokenizeToRecord  # noqa: E402
from _corpus import OUT, corpus_jsonl, tokenizer_path  # noqa: E402
from _harness import machine  # noqa: E402
from chute._src.storage.convert.convert import convert  # noqa: E402
from chute.sources import RecordFileDataSource  # noqa: E402

SHARDS = 8


def _cpu() -> float:
    """CPU seconds of this process and of its reaped children (Beam's workers)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def contenders(transforms: list[object]) -> dict[str, Callable[[Path, Path], float]]:
    import chute.beam

    def local(src: Path, out: Path) -> float:
        t0 = time.perf_counter()
        convert([str(src)], str(out), shards=SHARDS, transforms=transforms, progress=False)
        return time.perf_counter() - t0

    def beam(workers: int) -> Callable[[Path, Path], float]:
        def run(src: Path, out: Path) -> float:
            t0 = time.perf_counter()
            chute.beam.convert(
                [str(src)], str(out), shards=SHARDS, transforms=transforms, num_workers=workers
            )
            return time.perf_counter() - t0

        return run

    return {
        "chute convert (1 process)": local,
        "Beam DirectRunner, 1 worker": beam(1),
        "Beam DirectRunner, 2 workers": beam(2),
    }


def records(out: Path) -> list[bytes]:
    src = RecordFileDataSource(str(out))
    return [src[i] for i in range(len(src))]


def measure(n: int, rounds: int, runs: dict[str, Callable[[Path, Path], float]]) -> list[str]:
    src = corpus_jsonl(n) if n > 1000 else _tiny(n)
    mb = src.stat().st_size / 1e6
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    reference: list[bytes] | None = None
    for r in range(rounds):
        for name, run in runs.items():
            out = OUT / "beam_bench_out"
            shutil.rmtree(out, ignore_errors=True)
            cpu = _cpu()
            times[name].append(run(src, out))
            cpus[name].append(_cpu() - cpu)
            got = records(out)
            if reference is None:
                reference = got
            assert got == reference, f"{name} wrote other records"
            print(
                f"  n={n:,} round {r + 1}: {name}: {times[name][-1]:.2f} s, "
                f"{cpus[name][-1]:.2f} CPU s",
                flush=True,
            )
    base = statistics.median(times[next(iter(runs))])
    lines = [f"{n:,} records, {mb:.1f} MB of JSONL, {rounds} round(s), median:"]
    lines.append(
        f"  {'contender':<30} {'seconds':>8} {'records/s':>10} {'MB/s':>7} {'vs convert':>10}"
        f" {'CPU s':>7}"
    )
    for name, ts in times.items():
        t = statistics.median(ts)
        c = statistics.median(cpus[name])
        lines.append(
            f"  {name:<30} {t:>8.2f} {n / t:>10,.0f} {mb / t:>7.2f} {base / t:>9.2f}x {c:>7.1f}"
        )
    return lines


def _tiny(n: int) -> Path:
    path = OUT / f"corpus_tiny_{n}.jsonl"
    if not path.exists():
        lines = corpus_jsonl(120_000).open().readlines()[:n]
        path.write_text("".join(lines))
    return path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[120_000, 1_200_000])
    p.add_argument("--rounds", type=int, nargs="+", default=[3, 1])
    p.add_argument("--tiny-rounds", type=int, default=3)
    args = p.parse_args()
    transforms: list[object] = [TokenizeToRecord(str(tokenizer_path()))]
    runs = contenders(transforms)
    report = [
        "bench_beam: JSONL corpus -> 8 .crec shards with bert tokenization at conversion time",
        f"machine: {machine()}; shared with 4 other engineers running tests (loaded: compare",
        "ratios within a table, not absolute figures)",
        "",
    ]
    report += measure(100, args.tiny_rounds, runs)
    report.append("")
    for n, rounds in zip(args.sizes, args.rounds + [args.rounds[-1]] * len(args.sizes)):
        report += measure(n, rounds, runs)
        report.append("")
    print("\n".join(report))


if __name__ == "__main__":
    main()
