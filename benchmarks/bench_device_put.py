"""A JAX training loop with and without `chute.experimental.device_put`: the share of each
step the loop spends waiting for its batch.

The pipeline: image-like elements made with numpy (a 64x64x3 uint8 picture drawn from a
generator keyed by the element's index, a random crop offset and flip, normalised to
float32), batched by 64, read with `ReadOptions(num_threads=0)` as seed 003 does, so the
pipeline's work runs wherever its iterator is advanced. The step: a jitted function whose
cost is a `fori_loop` of `k` matmuls (64x512 by 512x512); `k` is calibrated at start so that one step takes
about as long as the pipeline takes to make one batch (the case where overlapping matters
most: either alone would keep the device busy half the time).

Contenders, interleaved round by round, medians over rounds reported:
- `jax.device_put in the loop` (seed 000's loop): `batch = next(it)`, then
  `jax.device_put(batch, device)`; the pipeline and the copy run between steps.
- `chute device_put`: `it = iter(device_put(ds, device))` (cpu_buffer_size=4,
  device_buffer_size=2): the pipeline runs in a host thread, copies start ahead.

Each step: `t0`, take the batch and wait until it is on the device
(`jax.block_until_ready`), `t1`, run the step and wait for its loss (the loop logs it),
`t2`. Waiting share = sum(t1 - t0) / sum(t2 - t0). Runs on CPU (here) and unchanged on a
GPU machine: it needs only numpy and jax beside chute's own dependencies.

    PYTHONPATH=src python3 benchmarks/bench_device_put.py --out DIR [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
import chute

SIDE = 64
BATCH = 64
WIDTH = 512  # the step's matmul size
RESULTS = Path(__file__).resolve().parent / "results" / "2026-11-23"


def make_element(i: int) -> np.ndarray:
    """A 64x64x3 float32 picture: drawn, cropped from a larger one, maybe flipped,
    normalised: about the per-element host work of an image pipeline."""
    rng = np.random.default_rng(i)
    big = rng.integers(0, 256, size=(SIDE + 16, SIDE + 16, 3), dtype=np.uint8)
    y, x = rng.integers(0, 17, size=2)
    crop = big[y : y + SIDE, x : x + SIDE]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    out = crop.astype(np.float32) / 255.0
    return (out - out.mean(axis=(0, 1))) / (out.std(axis=(0, 1)) + 1e-6)


def pipeline() -> chute.IterDataset[Any]:
    return (
        chute.MapDataset.range(10_000_000)
        .shuffle(seed=0)
        .map(make_element)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .batch(BATCH, drop_remainder=True)
    )


def make_step() -> tuple[Callable[..., Any], Any]:
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    params = {
        "w_in": jax.random.normal(key, ((SIDE // 4) ** 2 * 3, WIDTH), jnp.float32) * 0.05,
        "w": jax.random.normal(key, (WIDTH, WIDTH), jnp.float32) / WIDTH**0.5,
    }

    @jax.jit
    def step(params: Any, batch: Any, k: Any) -> tuple[Any, Any]:
        pooled = batch[:, ::4, ::4, :].reshape(batch.shape[0], -1)  # the whole batch is read
        h = jnp.tanh(pooled @ params["w_in"] + jnp.mean(batch))
        h = jax.lax.fori_loop(0, k, lambda _, h: jnp.tanh(h @ params["w"]), h)
        loss = jnp.mean(h**2)
        return {**params, "w": params["w"] * (1 - 1e-6 * loss)}, loss

    return step, params


def batch_seconds(n: int) -> float:
    """The median time the pipeline takes to make one batch, on this thread."""
    it = iter(pipeline())
    next(it)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t0)
    it.close()
    return statistics.median(times)


def step_seconds(step: Callable[..., Any], params: Any, batch: Any, k: int, n: int) -> float:
    import jax
    import jax.numpy as jnp

    kk = jnp.int32(k)
    jax.block_until_ready(step(params, batch, kk))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(step(params, batch, kk))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def calibrate(
    step: Callable[..., Any], params: Any, device: Any, quick: bool
) -> tuple[int, float, float]:
    """`k` for a step as long as a batch: (k, batch s, step s at k)."""
    import jax

    target = batch_seconds(5 if quick else 15)
    batch = jax.device_put(next(iter(pipeline())), device)
    k = 1
    while True:
        t = step_seconds(step, params, batch, k, 5)
        if t >= target / 4 or k >= 1 << 20:
            break
        k *= 4
    k = max(1, round(k * target / t))
    return k, target, step_seconds(step, params, batch, k, 5)


def loop(
    it: Iterator[Any],
    on_device: bool,
    step: Callable[..., Any],
    params: Any,
    k: int,
    device: Any,
    steps: int,
) -> tuple[float, float, float]:
    """(waiting share, ms waited per step, ms per step) over `steps` steps after 3 warm-up."""
    import jax
    import jax.numpy as jnp

    kk = jnp.int32(k)
    waited = total = 0.0
    for i in range(3 + steps):
        t0 = time.perf_counter()
        batch = next(it)
        if not on_device:
            batch = jax.device_put(batch, device)
        batch = jax.block_until_ready(batch)
        t1 = time.perf_counter()
        params, loss = step(params, batch, kk)
        float(loss)  # the loop logs its loss: the step is done
        t2 = time.perf_counter()
        if i >= 3:
            waited += t1 - t0
            total += t2 - t0
    return waited / total, 1000 * waited / steps, 1000 * total / steps


def contenders(device: Any) -> dict[str, Callable[[], tuple[Iterator[Any], bool]]]:
    return {
        "jax.device_put in the loop": lambda: (iter(pipeline()), False),
        "chute device_put": lambda: (iter(chute.experimental.device_put(pipeline(), device)), True),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for bench_device_put.txt")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument(
        "--note", default="", help="a line for the result file (e.g. the machine was shared)"
    )
    args = p.parse_args()
    import jax

    device = jax.devices()[0]
    rounds = args.rounds or (2 if args.quick else 5)
    steps = 10 if args.quick else 30
    step, params = make_step()
    k, batch_s, step_s = calibrate(step, params, device, args.quick)
    runs = contenders(device)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, make in runs.items():
            it, on_device = make()
            try:
                results[name].append(loop(it, on_device, step, params, k, device, steps))
            finally:
                it.close()  # type: ignore[attr-defined]
    lines = [
        "# bench_device_put: the share of each training step spent waiting for data",
        f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"jax {jax.__version__}, numpy {np.__version__}; device: {device.platform} "
        f"({getattr(device, 'device_kind', '?')})",
        f"# batch {BATCH} x {SIDE}x{SIDE}x3 float32 ({BATCH * SIDE * SIDE * 3 * 4 / 2**20:.1f} MiB); "
        f"pipeline alone: {1000 * batch_s:.1f} ms per batch; step: k={k} matmuls of "
        f"{WIDTH}x{WIDTH}, {1000 * step_s:.1f} ms",
        f"# alone, one after the other: {1000 * (batch_s + step_s):.1f} ms per step; perfectly "
        f"overlapped: {1000 * max(batch_s, step_s):.1f} ms",
        f"# {rounds} rounds x {steps} steps per contender, interleaved; medians over rounds",
        *([f"# {args.note}"] if args.note else []),
        "",
        f"{'loop':<28}  {'waiting share':>13}  {'wait ms/step':>12}  {'ms/step':>8}  {'steps/s':>8}",
    ]
    for name, rs in results.items():
        share = statistics.median(r[0] for r in rs)
        wait = statistics.median(r[1] for r in rs)
        per = statistics.median(r[2] for r in rs)
        lines.append(
            f"{name:<28}  {100 * share:>12.1f}%  {wait:>12.1f}  {per:>8.1f}  {1000 / per:>8.1f}"
        )
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_device_put.txt").write_text(text)


if __name__ == "__main__":
    main()
