"""`import chute` loads almost nothing: each public name is imported on first use, so a
worker process (forked from a server that imported numpy and the worker loop only) loads
just the modules its pipeline is made of.

Each check runs in a fresh interpreter, where `sys.modules` shows what was imported.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import chute
from process_helpers import run_main

INIT = Path(chute.__file__)


def _fresh(tmp_path: Path, body: str) -> str:
    return run_main(tmp_path, body, timeout=120).stdout.strip()


def test_import_chute_loads_no_layer_until_a_name_is_used(tmp_path: Path) -> None:
    out = _fresh(
        tmp_path,
        """
        import chute
        before = [m for m in sorted(sys.modules) if m.startswith("chute._src.")]
        heavy = [m for m in ("numpy", "ssl", "obstore", "fsspec") if m in sys.modules]
        ds = chute.MapDataset.range(4).map(lambda x: x + 1)
        print(before, heavy, list(ds), "chute._src.core.dataset" in sys.modules)
        """,
    )
    # Only the options (where `import chute` registers how to load the debug layer) and
    # the package they sit in: no setting is read at import (CHUTE_CRC32C is read, and a
    # wrong value refused, where a checksum is first needed).
    assert out == "['chute._src.core', 'chute._src.core.config'] [] [1, 2, 3, 4] True"


def test_the_worker_loop_imports_neither_the_pool_nor_any_dataset(tmp_path: Path) -> None:
    # What the process that forks workers imports before it forks any.
    out = _fresh(
        tmp_path,
        """
        import chute._src.exec.mp._worker
        loaded = [m for m in sorted(sys.modules) if m.startswith("chute._src.")]
        heavy = ["ssl", "concurrent.futures", "obstore", "fsspec"]
        print(loaded, [m for m in heavy if m in sys.modules])
        """,
    )
    assert out == (
        "['chute._src.core', 'chute._src.core.config', 'chute._src.core.shm_files', "
        "'chute._src.exec', 'chute._src.exec.mp', 'chute._src.exec.mp._server_init', "
        "'chute._src.exec.mp._worker', 'chute._src.exec.mp.slabs', 'chute._src.exec.mp.transport', "
        "'chute._src.process_effects'] []"
    )


def test_the_crc32c_package_is_imported_only_without_the_native_extension(
    tmp_path: Path,
) -> None:
    out = _fresh(
        tmp_path,
        """
        import importlib.util
        import chute
        from chute._src.storage.records import checksum
        native = importlib.util.find_spec("chute._native") is not None
        print(native, "crc32c" in sys.modules, checksum.IMPLEMENTATION.startswith("native"))
        """,
    )
    native = out.split()[0] == "True"
    assert out == ("True False True" if native else "False True False")


def test_chute_torch_is_an_attribute_loaded_on_first_use(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is in the `torch` extra")
    out = _fresh(
        tmp_path,
        """
        import chute
        before = "torch" in sys.modules, "chute.torch" in sys.modules
        tensors = chute.torch.to_tensors({"x": chute.MapDataset.range(3).batch(3)[0]})
        print(before, type(tensors["x"]).__module__, tensors["x"].tolist())
        print("torch" in dir(chute), chute.torch is sys.modules["chute.torch"])
        """,
    )
    assert out == "(False, False) torch [0, 1, 2]\nTrue True"


def test_reading_local_records_loads_no_remote_client(tmp_path: Path) -> None:
    path = tmp_path / "data.crec"
    with chute.records.RecordWriter(str(path)) as w:
        for i in range(10):
            w.write(b"%d" % i)
    out = _fresh(
        tmp_path,
        f"""
        import chute
        src = chute.sources.RecordFileDataSource({str(path)!r})
        got = [src[i] for i in range(len(src))]
        print(got[3], [m for m in ("ssl", "obstore", "fsspec") if m in sys.modules])
        """,
    )
    assert out == "b'3' []"


def _type_checking_imports() -> dict[str, str]:
    """What type checkers see in chute/__init__.py: name -> the module it comes from."""
    tree = ast.parse(INIT.read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_typing.TYPE_CHECKING"
    )
    seen = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names:
            assert alias.asname == alias.name, ast.unparse(node)
            seen[alias.name] = (
                f"{node.module}.{alias.name}" if node.module == "chute" else node.module
            )
    return seen


def test_what_type_checkers_see_is_what_each_name_resolves_to() -> None:
    typed = _type_checking_imports()
    assert sorted(typed) == sorted(vars(chute)["__all__"])
    for name, module in typed.items():
        value = getattr(chute, name)
        if module == f"chute.{name}":
            assert value.__name__ == module  # a submodule
        else:
            assert value is getattr(sys.modules[module], name), name
    assert set(vars(chute)["__all__"]) <= set(dir(chute))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'chute' has no attribute 'MapDatset'"):
        chute.MapDatset  # type: ignore[attr-defined]  # noqa: B018
