"""A/B of `bench_rampup.py`'s fresh-process runs: two or more checkouts of chute (or
contenders) alternate within each round, so that a change is compared with what it
replaced on the same machine in the same minutes (single runs spread widely on a shared
2-core machine).

Each arm is `NAME=SRC[:CONTENDER]`: SRC is the `src` directory of a checkout of chute
(`git worktree add /tmp/before <commit>` makes one), CONTENDER one of bench_rampup's
contenders (default: the `--contender` given). Prints each run, then per arm the medians
of the first batch and of first 10 / steady, and the lowest ratio.

    python benchmarks/rampup_ab.py --pipeline "text padded" --rounds 7 \\
        before=/tmp/before/src after=src "torch=src:torch fork"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("arms", nargs="+", help="NAME=SRC[:CONTENDER]")
    parser.add_argument("--pipeline", default="image")
    parser.add_argument("--contender", default="chute")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steady-s", type=float, default=3.0)
    args = parser.parse_args()
    arms: dict[str, tuple[str, str]] = {}
    for arm in args.arms:
        name, _, spec = arm.partition("=")
        src, _, contender = spec.partition(":")
        arms[name] = (str(Path(src).resolve()), contender or args.contender)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, (src, contender) in arms.items():
            cmd = [sys.executable, str(HERE / "bench_rampup.py"), "--child", args.pipeline]
            cmd += [contender, "--steady-s", str(args.steady_s)]
            env = {**os.environ, "PYTHONPATH": src}
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"{name}: {cmd} failed:\n{done.stderr[-3000:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            run["ratio"] = run["first10"] / run["steady"]
            runs[name].append(run)
            print(
                f"{name}: first batch {run['first_s']:.3f} s, first 10 / steady "
                f"{run['ratio']:.2f}, steady {run['steady']:,.0f}/s",
                flush=True,
            )
    for name, got in runs.items():
        print(
            f"== {name}: first batch {statistics.median(r['first_s'] for r in got):.3f} s, "
            f"first 10 / steady {statistics.median(r['ratio'] for r in got):.2f} "
            f"(lowest {min(r['ratio'] for r in got):.2f}), steady "
            f"{statistics.median(r['steady'] for r in got):,.0f}/s "
            f"(medians of {args.rounds} rounds)"
        )


if __name__ == "__main__":
    main()
