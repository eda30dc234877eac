"""`chute explain CHECKPOINT --steps A:B --pipeline module:function`: the records behind
those steps of the run that saved CHECKPOINT (`chute.experimental.provenance`).

CHECKPOINT is a file written by `chute.checkpoint.save`, or a directory of chute's Orbax
handler (`process_{i}-of-{n}.json`, found in it or in one folder below, such as an Orbax
step's `data` item). The pipeline is not in a checkpoint (its functions are code): the
`--pipeline` function builds it, as for the run. It is `module:function` (the module
imported with the current directory on `sys.path`) or `path/to/file.py:function`. A
function with parameters `process_index` and `process_count` is given the host's, so it
builds that host's shard; `--host I` picks host I's state, `--all-hosts` explains every
host's.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PROCESS_FILE = re.compile(r"process_(\d{1,18})-of-(\d{1,18})\.json")
_COLUMNS = ("step", "offset", "source", "index", "epoch", "file", "shard", "record")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a chute.checkpoint.save file, or a directory written by chute's Orbax handler",
    )
    p.add_argument(
        "--steps",
        required=True,
        help="the steps, counted from the pipeline's start: A:B (A to B-1), or A",
    )
    p.add_argument(
        "--pipeline",
        required=True,
        help="module:function (or file.py:function) returning the run's dataset or DataLoader",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    hosts = p.add_mutually_exclusive_group()
    hosts.add_argument("--host", type=int, default=None, help="the host (process) index to read")
    hosts.add_argument("--all-hosts", action="store_true", help="explain every host's steps")


def parse_steps(text: str) -> range:
    """`A:B` as `range(A, B)`, `A` as `range(A, A + 1)`."""
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if m is None or (m[2] is not None and int(m[2]) <= int(m[1])):
        raise ValueError(
            f"--steps {text!r} is invalid: give A:B with 0 <= A < B (steps A to B-1, counted "
            "from the pipeline's start), or one step A"
        )
    start = int(m[1])
    return range(start, int(m[2]) if m[2] is not None else start + 1)


def load_builder(spec: str) -> Callable[..., Any]:
    """The function named by `module:function` or `file.py:function`."""
    module_name, sep, fn = spec.rpartition(":")
    if not sep or not module_name or not fn.isidentifier():
        raise ValueError(
            f"--pipeline {spec!r} is invalid: give module:function (or file.py:function), "
            "a function returning the run's dataset or DataLoader, e.g. train_data:pipeline"
        )
    if module_name.endswith(".py"):
        from chute._src.debug.bench_cli import load_pipeline

        return load_pipeline(module_name, fn)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    func = getattr(module, fn, None)
    if not callable(func):
        raise ValueError(
            f"--pipeline {spec!r}: module {module_name!r} defines no function {fn!r}: define "
            f"`def {fn}():` returning the run's dataset or DataLoader"
        )
    return func


def build(builder: Callable[..., Any], host: int, count: int) -> Any:
    """The pipeline of host `host` of `count`."""
    params = inspect.signature(builder).parameters
    if "process_index" in params and "process_count" in params:
        return builder(process_index=host, process_count=count)
    return builder()


def host_files(path: Path) -> dict[int, tuple[int, Path]]:
    """The Orbax process files in `path` or one folder below: host -> (count, file)."""
    for folder in (path, *sorted(p for p in path.iterdir() if p.is_dir())):
        found = {}
        for f in folder.iterdir():
            if m := _PROCESS_FILE.fullmatch(f.name):
                found[int(m[1])] = (int(m[2]), f)
        if found:
            return found
    raise FileNotFoundError(
        f"{str(path)!r} holds no chute checkpoint (process_I-of-N.json, in it or one folder "
        "below): give a file written by chute.checkpoint.save or the directory of chute's "
        "Orbax handler"
    )


def states(path: Path, host: int | None, all_hosts: bool) -> list[tuple[int, int, Any]]:
    """(host, host count, state) for each host to explain."""
    from chute._src.core.checkpointing import decode, read_file

    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist: give a checkpoint file or folder")
    if path.is_file():
        if host not in (None, 0) or all_hosts:
            raise ValueError(
                f"{str(path)!r} is one host's file: --host and --all-hosts need an Orbax folder"
            )
        return [(0, 1, decode(read_file(path), repr(str(path))))]
    files = host_files(path)
    chosen = sorted(files) if all_hosts else [0 if host is None else host]
    out = []
    for h in chosen:
        if h not in files:
            raise ValueError(f"--host {h}: {str(path)!r} holds the states of hosts {sorted(files)}")
        count, f = files[h]
        out.append((h, count, decode(read_file(f), repr(str(f)))))
    return out


def explain(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per record of the steps asked for (with `host` under --all-hosts)."""
    from chute._src.core.provenance_api import provenance

    steps = parse_steps(args.steps)
    builder = load_builder(args.pipeline)
    rows = []
    for host, count, state in states(Path(args.checkpoint), args.host, args.all_hosts):
        ds = build(builder, host, count)
        for step, records in zip(steps, provenance(state, steps, dataset=ds)):
            for r in records:
                row = {"step": step, **r, "offset": list(r["offset"])}
                if args.all_hosts:
                    row = {"host": host, **row}
                rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """`rows` as aligned columns, those no row has left out."""
    extra = [k for r in rows for k in r if k not in _COLUMNS and k != "host"]
    names = [c for c in ("host", *_COLUMNS, *dict.fromkeys(extra)) if any(c in r for r in rows)]
    cells = [[_cell(r.get(c)) for c in names] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(names)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(names, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def run(args: argparse.Namespace) -> int:
    rows = explain(args)
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
    else:
        print(table(rows))
    return 0
