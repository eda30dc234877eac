"""One host of an elastic run, as its own process (tests/frameworks/test_elastic.py).

    python elastic_host.py CONFIG_JSON

CONFIG: {"pipeline": "plain" | "filter", "shard_index", "shard_count", "host_batch",
"steps", "states_in", "out_dir", "restore": null | "own" | "merge" | "host0"}. Restores
from the states of the previous run in `states_in` (`process_{i}-of-{n}.json`, one per old
host), runs `steps` steps, writes its own state to `out_dir/process_{j}-of-{m}.json` and
the values it delivered to `out_dir/out_{j}.json`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import chute
from chute.experimental import ElasticIterator

N = 64  # elements per epoch


def tag(i: int, x: int) -> int:
    return (i // N) * N + x  # epoch * N + element: unique over epochs


def kept(v: int) -> bool:
    return v % N % 3 != 0


def dataset(pipeline: str) -> chute.MapDataset[int]:
    ds = chute.MapDataset.range(N).shuffle(seed=7).repeat(None).map_with_index(tag)
    return ds.filter(kept) if pipeline == "filter" else ds


def make(cfg: dict[str, Any]) -> ElasticIterator:
    m = cfg["shard_count"]
    shard = chute.sharding.ShardOptions(cfg["shard_index"], m)
    return ElasticIterator(dataset(cfg["pipeline"]), cfg["host_batch"] * m, shard)


def main(cfg: dict[str, Any]) -> None:
    d, nxt = Path(cfg["states_in"]), Path(cfg["out_dir"])
    it = make(cfg)
    j, m = cfg["shard_index"], cfg["shard_count"]
    if cfg["restore"] is not None:
        old = [json.loads(p.read_text()) for p in sorted(d.glob("process_*-of-*.json"))]
        if cfg["restore"] == "own":
            it.set_state(json.loads((d / f"process_{j}-of-{m}.json").read_text()))
        elif cfg["restore"] == "host0":  # Grain's way: any one host's state for all
            it.set_state(next(s for s in old if s["shard_index"] == 0))
        else:
            it.set_state(ElasticIterator.merge_states(old))
    out = [next(it).tolist() for _ in range(cfg["steps"])]
    nxt.mkdir(exist_ok=True)
    (nxt / f"process_{j}-of-{m}.json").write_text(json.dumps(it.get_state()))
    (nxt / f"out_{j}.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
