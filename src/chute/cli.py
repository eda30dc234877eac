"""The `chute` command line: `chute convert`, `inspect`, `verify`, `bench`, `explain`.

Each subcommand is a `Command`: a name, a help line, a function that adds its arguments
to an argparse parser and a function that runs it and returns the exit status. A new
subcommand is one more entry in `COMMANDS`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chute._src.core.errors import DataError, MissingFileError

__all__ = ["COMMANDS", "Command", "main"]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _format(value: str) -> object:
    from chute._src.storage.convert.inputs import Format

    try:
        return Format(value)
    except ValueError:
        choices = ", ".join(f.value for f in Format)
        raise argparse.ArgumentTypeError(
            f"unknown format {value!r}; use one of {choices}"
        ) from None


def _progress_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--progress",
        dest="progress",
        action="store_const",
        const=True,
        default=None,
        help="draw a progress bar even when stderr is not a terminal",
    )
    g.add_argument(
        "--no-progress", dest="progress", action="store_const", const=False, help="no bar"
    )


def _storage_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-options",
        type=_json_object,
        default=None,
        metavar="JSON",
        help="fsspec storage options for URLs, as a JSON object, e.g. "
        '\'{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}\' '
        "(fsspec's FSSPEC_<PROTOCOL>_<OPTION> environment variables work too)",
    )


def _json_object(text: str) -> dict[str, object]:
    import json

    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): give a JSON object") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object: give {{...}}")
    return value


def _convert_args(p: argparse.ArgumentParser) -> None:
    from chute._src.storage.convert.convert import COMPRESSIONS

    p.add_argument(
        "paths", nargs="+", metavar="INPUT... OUTPUT", help="input files or globs, then the output"
    )
    p.add_argument("--shards", type=int, default=1, help="write N shards into an OUTPUT directory")
    p.add_argument(
        "--compress",
        choices=COMPRESSIONS,
        default="none",
        help="per-record compression (zstd-dict trains a dictionary stored in the file)",
    )
    p.add_argument("--level", type=int, default=3, help="zstd level (default 3)")
    p.add_argument(
        "--from",
        dest="from_format",
        type=_format,
        help="input format, if the extension does not tell",
    )
    p.add_argument(
        "--to", dest="to_format", type=_format, help="output format: crec (default) or arrayrecord"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace OUTPUT if it exists: a dataset directory is replaced atomically and "
        "only the shards its manifest lists are removed; other files are never deleted",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="sharded output: keep the complete shards of an interrupted run of the same job",
    )
    p.add_argument(
        "--map",
        dest="maps",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="preprocess each record with this transformation (a chute.transforms.Map, "
        "RandomMap, Filter, a list of them, or a function), imported from MODULE; "
        "repeatable, applied in order; the last must return bytes",
    )
    p.add_argument("--seed", type=int, help="the pipeline seed RandomMap transformations draw from")
    p.add_argument(
        "--runner",
        choices=("local", "beam"),
        default="local",
        help="local: this process (default); beam: an Apache Beam job writing "
        "part-NNNNN-of-NNNNN shards (locally the DirectRunner; Beam options after --)",
    )
    p.add_argument(
        "--num-workers",
        type=int,
        default=2,
        help="--runner beam: DirectRunner worker processes (default 2)",
    )
    _storage_flag(p)
    _progress_flags(p)


def _load_transforms(specs: list[str]) -> list[object]:
    import importlib

    out: list[object] = []
    for spec in specs:
        module, _, name = spec.partition(":")
        if not module or not name:
            raise ValueError(
                f"--map {spec!r} is invalid; give MODULE:NAME, e.g. mypkg.prep:tokenize"
            )
        obj: object = importlib.import_module(module)
        for part in name.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                raise ValueError(f"--map {spec!r}: {module} has no {name!r}") from None
        out.extend(obj if isinstance(obj, list | tuple) else [obj])
    return out


def _run_convert(args: argparse.Namespace) -> int:
    from chute._src.storage.convert.convert import convert

    if len(args.paths) < 2:
        print("chute convert: give at least one INPUT and an OUTPUT", file=sys.stderr)
        return 2
    *inputs, output = args.paths
    job: dict[str, Any] = {  # what either runner is given
        "from_format": args.from_format,
        "to_format": args.to_format,
        "shards": args.shards,
        "compression": args.compress,
        "level": args.level,
        "transforms": _load_transforms(args.maps),
        "seed": args.seed,
        "storage_options": args.storage_options,
    }
    if args.runner == "beam":
        if args.overwrite or args.resume:
            raise ValueError(
                "--runner beam writes into a new directory and a rerun of the same job "
                "finishes it (no --resume needed); --overwrite is not supported: write to "
                "a new directory"
            )
        from chute._src.storage.convert.beam.run import convert as beam_convert

        r = beam_convert(
            inputs, output, **job, num_workers=args.num_workers, beam_args=args.beam_options
        )
    else:
        if args.beam_options:
            raise ValueError(
                f"options after -- ({' '.join(args.beam_options)}) are Beam pipeline "
                "options: add --runner beam"
            )
        r = convert(
            inputs,
            output,
            **job,
            overwrite=args.overwrite,
            resume=args.resume,
            progress=args.progress,
        )
    if r.resumed_records:
        print(f"resumed: kept {r.resumed_records:,} records already converted")
    rate = r.bytes_in / max(r.seconds, 1e-9) / 1e6
    print(
        f"wrote {r.records:,} records to {output}: {r.bytes_in:,} bytes in, "
        f"{r.bytes_out:,} bytes out, {r.seconds:.2f} s ({rate:.1f} MB/s)"
    )
    return 0


def _inspect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="files, globs or directories: a dataset directory (with manifest.json) or a "
        "directory of data files of one format",
    )
    p.add_argument(
        "--from",
        dest="from_format",
        type=_format,
        help="the format, if neither the file's name nor its first bytes tell",
    )
    p.add_argument("-n", "--show", type=int, default=3, help="records to show (default 3)")
    _storage_flag(p)


def _run_inspect(args: argparse.Namespace) -> int:
    from chute._src.storage.convert.summary import inspect_lines

    for line in inspect_lines(args.paths, args.from_format, args.show, args.storage_options):
        print(line)
    return 0


def _verify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="files, globs or directories: a dataset directory (with manifest.json) or a "
        "directory of data files of one format",
    )
    p.add_argument(
        "--from",
        dest="from_format",
        type=_format,
        help="the format, if neither the file's name nor its first bytes tell",
    )
    p.add_argument(
        "--write-manifest",
        action="store_true",
        help="PATH is a directory of .crec or ArrayRecord shards written by any engine: "
        "check them, write its manifest.json, then verify the dataset",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="--write-manifest: replace a chute manifest that lists other shards",
    )
    _storage_flag(p)
    _progress_flags(p)


def _run_verify(args: argparse.Namespace) -> int:
    from chute._src.core.progress import Progress
    from chute._src.storage.convert.summary import verify_any

    if args.write_manifest:
        from chute._src.storage.records.adopt import write_manifest

        if len(args.paths) != 1:
            raise ValueError("--write-manifest takes one directory")
        print(f"wrote {write_manifest(args.paths[0], overwrite=args.overwrite)}")

    bar: Progress[object] = Progress(desc="verify", force=args.progress)
    try:
        n, checked = verify_any(args.paths, args.from_format, bar.update, args.storage_options)
    except MissingFileError:  # nothing to verify: an error in the arguments
        bar.close()
        raise
    except DataError as e:
        bar.close()
        print(f"FAILED: {_message(e, 'verify')}")
        return 1
    bar.close()
    print(f"OK: {n:,} records, {checked}")
    return 0


def _bench_args(p: argparse.ArgumentParser) -> None:
    from chute._src.debug.bench_cli import add_arguments

    add_arguments(p)


def _run_bench(args: argparse.Namespace) -> int:
    from chute._src.debug.bench_cli import run

    return run(args)


def _explain_args(p: argparse.ArgumentParser) -> None:
    from chute._src.debug.explain_cli import add_arguments

    add_arguments(p)


def _run_explain(args: argparse.Namespace) -> int:
    from chute._src.debug.explain_cli import run

    return run(args)


COMMANDS: list[Command] = [
    Command(
        "convert",
        "convert JSONL, ArrayRecord, Parquet, TFRecord or NumPy files to .crec or "
        "ArrayRecord, in this process or as an Apache Beam job",
        _convert_args,
        _run_convert,
    ),
    Command(
        "inspect",
        "show a dataset's format, record count, sizes, codecs and a few records",
        _inspect_args,
        _run_inspect,
    ),
    Command(
        "verify",
        "check every record's checksum; report the first bad record",
        _verify_args,
        _run_verify,
    ),
    Command(
        "bench",
        "time a pipeline: first batch, elements/s, per-stage summary with advice",
        _bench_args,
        _run_bench,
    ),
    Command(
        "explain",
        "print the records behind steps of a checkpointed run (a table, or --json)",
        _explain_args,
        _run_explain,
    ),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chute", description="chute: a fast, exactly reproducible data loader."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for c in COMMANDS:
        p = sub.add_parser(c.name, help=c.help, description=c.help)
        c.add_arguments(p)
        p.set_defaults(_run=c.run)
    return parser


def _message(e: BaseException, command: str) -> str:
    """`e`'s message without a leading `chute COMMAND: ` (main prints its own)."""
    text = str(e)
    prefix = f"chute {command}: "
    return text[len(prefix) :] if text.startswith(prefix) else text


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `chute` command line; returns the exit status.

    Errors in the data (`chute.DataError`), missing files and bad arguments print one
    line to stderr and return 1 instead of a traceback. Arguments after `--` are Beam
    pipeline options (`chute convert ... --runner beam -- --runner=DataflowRunner ...`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:  # what follows is for Beam (`chute convert ... --runner beam -- ...`)
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    args.beam_options = extra
    try:
        if extra and args.command != "convert":
            raise ValueError(
                f"options after -- are for `chute convert --runner beam`, not {args.command}"
            )
        status: int = args._run(args)
    except (DataError, FileNotFoundError, FileExistsError, ImportError, ValueError) as e:
        print(f"chute {args.command}: error: {_message(e, args.command)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of stdout left (`chute inspect ... | head`)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
