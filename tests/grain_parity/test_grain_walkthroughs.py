"""The Grain walkthroughs in tests/grain_parity/grain_walkthroughs/ run with chute and with Grain.

Each script there follows one of Grain's tutorials as a Grain user writes it, with
`import chute as grain`. Every script runs in a fresh interpreter twice: once as written, on
this checkout's `src`, and once with its imports switched from `chute` to `grain`, on the
real grain 0.2.18 (skipped, with the reason, when that or absl is not installed). Both runs
must exit 0 and print `ok` last: the second shows the script is valid Grain code, the first
that chute runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grain_helpers import base_env, grain_missing, imported_modules, run_python, to_grain

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
SCRIPTS = sorted((HERE / "grain_walkthroughs").glob("walk_*.py"))

# Scripts whose chute run fails for a known reason, kept strict so a fix is noticed.
CHUTE_XFAIL: dict[str, str] = {}

# Grain's worker processes read absl flags, which a plain script never parses; a Grain
# user's main() does it through absl.app. The runner marks them parsed, then runs the
# script as __main__ (so worker processes can import it again).
_GRAIN_BOOT = (
    "import runpy, sys\n"
    "from absl import flags\n"
    "flags.FLAGS.mark_as_parsed()\n"
    "runpy.run_path(sys.argv[1], run_name='__main__')\n"
)


def run_script(args: list[str], env: dict[str, str], cwd: Path) -> None:
    proc = run_python(args, env, cwd)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1] == "ok", (
        f"last line is not 'ok'\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )


def _chute_params() -> list:
    return [
        pytest.param(
            path,
            id=path.stem,
            marks=(
                [pytest.mark.xfail(strict=True, reason=CHUTE_XFAIL[path.stem])]
                if path.stem in CHUTE_XFAIL
                else []
            ),
        )
        for path in SCRIPTS
    ]


# One script per Grain tutorial topic.
TOPICS = {
    "walk_dataset_basics",
    "walk_dataset_advanced",
    "walk_data_loader",
    "walk_samplers",
    "walk_transformations",
    "walk_data_sources",
    "walk_packing",
    "walk_debugging",
}


def test_every_script_is_found() -> None:
    assert {p.stem for p in SCRIPTS} == TOPICS


@pytest.mark.parametrize("script", _chute_params())
def test_walkthrough_runs_with_chute(script: Path, tmp_path: Path) -> None:
    env = base_env()
    env["PYTHONPATH"] = str(SRC)
    run_script([str(script)], env, tmp_path)


@pytest.mark.parametrize("script", [pytest.param(p, id=p.stem) for p in SCRIPTS])
def test_walkthrough_runs_with_grain(script: Path, tmp_path: Path) -> None:
    reason = grain_missing()
    if reason is not None:
        pytest.skip(reason)
    grain_copy = tmp_path / script.name
    grain_copy.write_text(to_grain(script.read_text()))
    assert "chute" not in imported_modules(grain_copy.read_text())
    run_script(["-c", _GRAIN_BOOT, str(grain_copy)], base_env(), tmp_path)


def test_import_switch() -> None:
    source = "import chute as grain\nimport chute.python as pygrain\nfrom chute import sources\n"
    assert to_grain(source) == (
        "import grain\nimport grain.python as pygrain\nfrom grain import sources\n"
    )
