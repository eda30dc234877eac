"""Every way Orbax users save an item works with chute's handler, whatever they touch or
import first: `Composite` with `CheckpointSave`, `item_handlers=`, `Checkpointer(handler)`
with `args=`, and the legacy `Checkpointer(handler).save(path, item)`. Each case runs in a
fresh interpreter, so no earlier import registers anything for it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("orbax.checkpoint")

from process_helpers import SRC

SETUP = {
    # chute's handler touched before Orbax is imported, the arguments later.
    "handler_first": """
        import chute
        Handler = chute.checkpoint.CheckpointHandler
        import orbax.checkpoint as ocp
        Save, Restore = chute.checkpoint.CheckpointSave, chute.checkpoint.CheckpointRestore
    """,
    # Orbax first, then the arguments, the handler last.
    "orbax_first": """
        import orbax.checkpoint as ocp
        from chute.checkpoint import CheckpointRestore as Restore, CheckpointSave as Save
        import chute
        Handler = chute.checkpoint.CheckpointHandler
    """,
}

STYLES = {
    "composite": """
        m = ocp.CheckpointManager(d)
        m.save(1, args=ocp.args.Composite(data=Save(it)))
        m.wait_until_finished()
        m.restore(1, args=ocp.args.Composite(data=Restore(it2)))
    """,
    "item_handlers": """
        m = ocp.CheckpointManager(d, item_names=("data",), item_handlers={"data": Handler()})
        m.save(1, args=ocp.args.Composite(data=Save(it)))
        m.wait_until_finished()
        m.restore(1, args=ocp.args.Composite(data=Restore(it2)))
    """,
    "checkpointer_args": """
        c = ocp.Checkpointer(Handler())
        c.save(os.path.join(d, "x"), args=Save(it))
        c.restore(os.path.join(d, "x"), args=Restore(it2))
    """,
    "checkpointer_legacy": """
        c = ocp.Checkpointer(Handler())
        c.save(os.path.join(d, "x"), it)
        c.restore(os.path.join(d, "x"), it2)
    """,
}

BODY = """
import os, sys
d = sys.argv[1]
ds = chute.MapDataset.range(100).shuffle(seed=1).to_iter_dataset()
it = iter(ds)
seen = [next(it) for _ in range(7)]
it2 = iter(ds)
{style}
assert [next(it2) for _ in range(5)] == [next(it) for _ in range(5)], "not resumed"
print("resumed")
"""


@pytest.mark.parametrize("order", list(SETUP))
@pytest.mark.parametrize("style", list(STYLES))
def test_each_orbax_style_saves_and_restores(tmp_path: Path, style: str, order: str) -> None:
    code = textwrap.dedent(SETUP[order]) + BODY.format(style=textwrap.dedent(STYLES[style]))
    (tmp_path / "job.py").write_text(code)
    (tmp_path / "ckpt").mkdir()
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run(
        [sys.executable, str(tmp_path / "job.py"), str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("resumed")


def test_the_handler_is_an_orbax_handler_and_one_class_under_every_name() -> None:
    import orbax.checkpoint as ocp

    import chute
    import chute.python as pygrain

    handler = chute.checkpoint.CheckpointHandler
    assert issubclass(handler, ocp.CheckpointHandler)
    assert pygrain.PyGrainCheckpointHandler is handler
    assert ocp.args.get_registered_handler_cls(chute.checkpoint.CheckpointSave) is handler
