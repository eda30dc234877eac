"""An image pipeline: chute beside Grain 0.2.18 and the PyTorch DataLoader, 0 and 2 workers.

The pictures are real photographs shipped inside scikit-image (`skimage/data`: astronaut,
coffee, chelsea, rocket, ...) and matplotlib (`grace_hopper.jpg`), re-encoded with Pillow
as JPEG (quality 90) at a few sizes (shorter side 256 to 480) and crops: 320 files by
default in `bench_out/images/`, made once. Each element: read the file, decode it with
Pillow, a random 224x224 crop and a random horizontal flip with numpy (keyed by the
element's index), uint8 HWC; batches of 64. Every library does the same per-element work:

- chute: `MapDataset.source(paths).shuffle(seed).repeat().random_map(load_and_augment)
  .batch(64).to_iter_dataset()` (default ReadOptions: AUTOTUNE, computing ahead within a
  quarter of the available memory); Grain: the same but `.to_iter_dataset().batch(64)`, since its default
  ReadOptions would prefetch 500 batches (~5 GB) of a MapDataset batch. 2 workers:
  `.mp_prefetch(MultiprocessingOptions(num_workers=2))`.
- torch: a map-style `Dataset` doing the same in `__getitem__`, `DataLoader(batch_size=64,
  shuffle=True, num_workers=0 or 2)` with its default collate (tensors), one torch thread.

Images/s after the first batch, best round; contenders interleaved round by round.

    .venv/bin/python benchmarks/bench_image.py [--quick]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chute
from _harness import machine, table

OUT = Path(__file__).resolve().parents[1] / "bench_out"
CROP = 224
BATCH = 64
PHOTOS = (  # real photographs in skimage/data (the others are drawings or textures)
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "hubble_deep_field.jpg",
    "retina.jpg",
    "motorcycle_left.png",
    "ihc.png",
)
SHORT_SIDES = (256, 320, 400, 480)


def sample_pictures() -> list[Any]:
    """The photographs shipped in scikit-image and matplotlib, as RGB Pillow images."""
    from PIL import Image

    found: list[Path] = []
    try:
        import skimage

        data = Path(skimage.__file__).parent / "data"
        found += [data / name for name in PHOTOS if (data / name).exists()]
    except ImportError:
        pass
    import matplotlib

    found.append(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg")
    if len(found) < 3:
        raise SystemExit("bench_image: install the bench extra: pip install -e '.[bench]'")
    return [Image.open(p).convert("RGB") for p in found]


def make_images(count: int) -> list[str]:
    """`count` JPEG files in bench_out/images/, made once from the sample pictures."""
    folder = OUT / "images"
    paths = [folder / f"img_{k:05d}.jpg" for k in range(count)]
    if all(p.exists() for p in paths):
        return [str(p) for p in paths]
    folder.mkdir(parents=True, exist_ok=True)
    pictures = sample_pictures()
    rng = np.random.default_rng(0)
    for k, path in enumerate(paths):
        if path.exists():
            continue
        im = pictures[k % len(pictures)]
        short = SHORT_SIDES[(k // len(pictures)) % len(SHORT_SIDES)]
        scale = short / min(im.size)
        w, h = max(short, round(im.size[0] * scale)), max(short, round(im.size[1] * scale))
        resized = im.resize((w, h))
        # a different crop of the resized picture per file, so files differ
        cw, ch = min(w, int(short * 1.5)), min(h, int(short * 1.5))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        buf = io.BytesIO()
        resized.crop((x, y, x + cw, y + ch)).save(buf, format="JPEG", quality=90)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(buf.getvalue())
        tmp.rename(path)
    return [str(p) for p in paths]


def decode(path: str) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def augment(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random 224x224 crop and a random horizontal flip."""
    h, w = image.shape[:2]
    y = int(rng.integers(0, h - CROP + 1))
    x = int(rng.integers(0, w - CROP + 1))
    out = image[y : y + CROP, x : x + CROP]
    if rng.random() < 0.5:
        out = out[:, ::-1]
    return np.ascontiguousarray(out)


def load_and_augment(path: str, rng: np.random.Generator) -> np.ndarray:
    return augment(decode(path), rng)


def lib_module(name: str) -> Any:
    if name == "chute":
        return chute
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()  # as seed 003 does: grain reads absl flags
    return grain


def dataset(lib: str, paths: list[str], workers: int, repeat: bool = True) -> Any:
    """chute's or Grain's pipeline (the same code: `import chute as grain`)."""
    g = lib_module(lib)
    ds = g.MapDataset.source(paths).shuffle(seed=7)
    if repeat:
        ds = ds.repeat()
    ds = ds.random_map(load_and_augment, seed=3)
    if g is chute:
        # chute's idiom: batch on the MapDataset (workers then ship whole batches); its
        # threads prefetch at most 256 MiB. Grain's default ReadOptions (16 threads, 500
        # elements) would prefetch 500 batches (~5 GB) that way, so Grain batches after.
        it_ds = ds.batch(BATCH).to_iter_dataset()
    else:
        it_ds = ds.to_iter_dataset().batch(BATCH)
    if workers:
        opts = (
            chute.MultiprocessingOptions(num_workers=workers)
            if g is chute
            else g.multiprocessing.MultiprocessingOptions(num_workers=workers)
        )
        it_ds = it_ds.mp_prefetch(opts)
    return it_ds


class TorchImages:
    """A map-style torch Dataset doing the same per-element work (the generator is keyed
    by the element's index, as chute's `random_map` does)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        return augment(decode(self.paths[i]), np.random.default_rng([3, i]))


def torch_loader(
    paths: list[str], workers: int, prefetch_factor: int | None = None
) -> Iterator[Any]:
    """Batches forever: a new epoch (a new shuffle) whenever one ends. torch computes on
    one thread, as it does in its worker processes (its default of one thread per core
    only slows the batch copy on a busy machine)."""
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    torch.manual_seed(7)
    loader = DataLoader(
        TorchImages(paths),  # type: ignore[arg-type]
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        prefetch_factor=prefetch_factor,
    )
    while True:
        yield from loader


def close(it: Any) -> None:
    closer = getattr(it, "close", None)
    if closer is not None:
        closer()


def make_iter(lib: str, paths: list[str], workers: int) -> Iterator[Any]:
    if lib == "torch":
        return torch_loader(paths, workers)
    return iter(dataset(lib, paths, workers))


def images_per_s(lib: str, paths: list[str], workers: int, seconds: float) -> tuple[float, float]:
    """(images/s after the first batch, seconds to the first batch) of a fresh iterator,
    iterated for about `seconds`; the first includes creating it and starting workers."""
    t0 = time.perf_counter()
    it = make_iter(lib, paths, workers)
    try:
        next(it)
        first_s = time.perf_counter() - t0
        n, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < seconds:
            n += len(next(it))
        return n / (time.perf_counter() - t1), first_s
    finally:
        close(it)


LIBS = ("chute", "grain", "torch")


def measure(quick: bool) -> dict[str, dict[str, float]]:
    """Images/s under "0 workers" and "2 workers", and under "first batch, 2 workers" the
    seconds to the first batch of each library's first 2-worker iterator in this process.
    Contenders are interleaved round by round and the best round counts (2-worker runs
    get one round fewer: starting and stopping workers dominates their cost)."""
    paths = make_images(192 if quick else 320)
    seconds, rounds = (1.5, 2) if quick else (4.0, 3)
    out: dict[str, dict[str, float]] = {"0 workers": {}, "2 workers": {}}
    first: dict[str, float] = {}
    for r in range(rounds):
        for workers in (0, 2):
            if workers and r == rounds - 1:
                continue
            for lib in LIBS:
                rate, first_s = images_per_s(lib, paths, workers, seconds)
                key = f"{workers} workers"
                out[key][lib] = max(out[key].get(lib, 0.0), rate)
                if workers:
                    first.setdefault(lib, first_s)
    out["first batch, 2 workers"] = first
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    print(f"# bench_image: JPEG decode, random crop 224 + flip, batch 64\n# {machine()}")
    res = measure(args.quick)
    rows = []
    print(f"first batch with 2 workers, s: {res.pop('first batch, 2 workers')}")
    for config, r in res.items():
        rows.append(
            [
                config,
                f"{r['chute']:,.0f}",
                f"{r['grain']:,.0f}",
                f"{r['torch']:,.0f}",
                f"{r['chute'] / r['grain']:.2f}x",
                f"{r['chute'] / r['torch']:.2f}x",
            ]
        )
    headers = ["workers", "chute img/s", "grain img/s", "torch img/s", "/grain", "/torch"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
