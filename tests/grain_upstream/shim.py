"""Answers `import grain` (and the private `grain._src...` modules Grain's tests import)
with modules whose names resolve to chute's objects.

`install()` puts a meta-path finder first on `sys.meta_path`, so the real Grain installed
beside chute is never imported. A name is looked up, in order:

1. in this module's `_ADAPTERS` for that Grain module: Grain's private stage classes are
   built by a public method in chute (`source.RangeMapDataset(3)` is
   `chute.MapDataset.range(3)`); an adapter calls that method, and `isinstance` against it
   checks the class of what the method returns;
2. in `_ALIASES`, names that chute spells otherwise (`data_loader.DataLoader` is
   `chute.DataLoader`, `grain_logging` is absl's logging);
3. in chute's public modules (`chute`, `chute.experimental`, `chute.python`, ...);
4. in chute's internal modules, by class or function name, for helpers Grain keeps
   private (`batch.make_batch`).

A name found nowhere raises `AttributeError` naming the Grain module, so the test using it
fails with that message. The few Grain modules that hold test code, not implementation
(`grain._src.core.pytest`, `...transformations.testing_util`, `grain._src.core.tree_lib_test`),
are loaded from Grain's own files, with their `import grain` answered by this finder too.

The installed finder is configured by environment variables, so that worker processes the
tests start see the same `grain`: `CHUTE_GRAIN_SHIM_ROOT` is the directory standing for
Grain's package (its `__file__`, its test data and test-code modules).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import pkgutil
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

ROOT_ENV = "CHUTE_GRAIN_SHIM_ROOT"
# The file under the root listing Grain's module names, one a line.
MODULE_LIST = "grain_modules.txt"

# Grain's public modules and the chute module each one is.
_PUBLIC_MODULES = {
    "grain": "chute",
    "grain.python": "chute.python",
    "grain.experimental": "chute.experimental",
    "grain.python.experimental": "chute.python.experimental",
    "grain.transforms": "chute.transforms",
    "grain.sources": "chute.sources",
    "grain.samplers": "chute.samplers",
    "grain.sharding": "chute.sharding",
    "grain.checkpoint": "chute.checkpoint",
    "grain.constants": "chute.constants",
    "grain.multiprocessing": "chute.multiprocessing",
}

# Where a name Grain keeps in a private module is looked for, after the adapters: chute's
# public modules, most specific first.
_PUBLIC_SEARCH = (
    "chute",
    "chute.experimental",
    "chute.python",
    "chute.transforms",
    "chute.sources",
    "chute.samplers",
    "chute.sharding",
    "chute.testing",
    "chute.constants",
    "chute.checkpoint",
)

# Grain modules that are test code: loaded from Grain's files (copied under the root).
TEST_CODE_MODULES = (
    "grain._src.core.pytest",
    "grain._src.core.tree_lib_test",
    "grain._src.python.dataset.transformations.testing_util",
)


def _chute(path: str) -> Any:
    """`module:attr.attr` or `module` in chute, imported on use."""
    module_name, _, attrs = path.partition(":")
    value: Any = importlib.import_module(module_name)
    for attr in filter(None, attrs.split(".")):
        value = getattr(value, attr)
    return value


class _Adapter:
    """A Grain stage class built by a chute method: calling it builds the stage;
    `isinstance(x, it)` is true when `x` is of the class that method returns."""

    def __init__(self, name: str, build: Callable[..., Any], classes: Sequence[str]):
        self.__name__ = self.__qualname__ = name
        self._build = build
        self._classes = classes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._build(*args, **kwargs)

    def __instancecheck__(self, obj: Any) -> bool:
        return any(isinstance(obj, _chute(c)) for c in self._classes)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        return (_chute(self._classes[0]),)

    def __repr__(self) -> str:
        return f"<adapter for Grain's {self.__name__}>"


class _Alternatives:
    """Several chute classes with one Grain name."""

    def __init__(self, name: str, classes: Sequence[type]):
        self.__name__ = self.__qualname__ = name
        self._classes = tuple(classes)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._classes[0](*args, **kwargs)

    def __instancecheck__(self, obj: Any) -> bool:
        return isinstance(obj, self._classes)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[Any, ...]:
        return (self._classes[0],)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._classes[0], name)


def _map_dataset() -> Any:
    return _chute("chute:MapDataset")


def _iter_dataset() -> Any:
    return _chute("chute:IterDataset")


# Grain's private stage classes, as the chute calls that build them. Keyword names follow
# Grain's constructors.
def _build_adapters() -> dict[str, dict[str, Any]]:
    ds = "grain._src.python.dataset"
    tr = f"{ds}.transformations"
    out: dict[str, dict[str, Any]] = {}

    def add(module: str, name: str, classes: Sequence[str]) -> Callable[..., _Adapter]:
        def wrap(build: Callable[..., Any]) -> _Adapter:
            a = _Adapter(name, build, classes)
            out.setdefault(module, {})[name] = a
            return a

        return wrap

    @add(f"{tr}.source", "SourceMapDataset", ["chute:MapDataset"])
    def _source(source: Any) -> Any:
        return _map_dataset().source(source)

    @add(f"{tr}.source", "RangeMapDataset", ["chute:MapDataset"])
    def _range(start: int, stop: int | None = None, step: int = 1) -> Any:
        return _map_dataset().range(start, stop, step)

    @add(f"{tr}.map", "MapMapDataset", ["chute:MapDataset"])
    def _map_map(parent: Any, transform: Any) -> Any:
        return parent.map(transform)

    @add(f"{tr}.map", "MapIterDataset", ["chute:IterDataset"])
    def _map_iter(parent: Any, transform: Any) -> Any:
        return parent.map(transform)

    @add(f"{tr}.map", "RandomMapMapDataset", ["chute:MapDataset"])
    def _rmap_map(parent: Any, transform: Any, seed: int | None = None) -> Any:
        return parent.random_map(transform, seed=seed)

    @add(f"{tr}.map", "RandomMapIterDataset", ["chute:IterDataset"])
    def _rmap_iter(parent: Any, transform: Any, seed: int | None = None) -> Any:
        return parent.random_map(transform, seed=seed)

    @add(f"{tr}.map", "MapWithIndexMapDataset", ["chute:MapDataset"])
    def _mwi_map(parent: Any, transform: Any) -> Any:
        return parent.map_with_index(transform)

    @add(f"{tr}.map", "MapWithIndexIterDataset", ["chute:IterDataset"])
    def _mwi_iter(parent: Any, transform: Any) -> Any:
        return parent.map_with_index(transform)

    @add(f"{tr}.filter", "FilterMapDataset", ["chute:MapDataset"])
    def _filter_map(parent: Any, transform: Any) -> Any:
        return parent.filter(transform)

    @add(f"{tr}.filter", "FilterIterDataset", ["chute:IterDataset"])
    def _filter_iter(parent: Any, transform: Any) -> Any:
        return parent.filter(transform)

    @add(f"{tr}.batch", "BatchMapDataset", ["chute:MapDataset"])
    def _batch_map(
        parent: Any, batch_size: int, drop_remainder: bool = False, batch_fn: Any = None
    ) -> Any:
        return parent.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)

    @add(f"{tr}.batch", "BatchIterDataset", ["chute:IterDataset"])
    def _batch_iter(
        parent: Any, batch_size: int, drop_remainder: bool = False, batch_fn: Any = None
    ) -> Any:
        return parent.batch(batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)

    @add(f"{tr}.repeat", "RepeatMapDataset", ["chute:MapDataset"])
    def _repeat_map(
        parent: Any, num_epochs: int | None = None, *, reseed_each_epoch: bool = True
    ) -> Any:
        return parent.repeat(num_epochs, reseed_each_epoch=reseed_each_epoch)

    @add(f"{tr}.shuffle", "ShuffleMapDataset", ["chute:MapDataset"])
    def _shuffle_map(parent: Any, seed: int | None = None) -> Any:
        return parent.shuffle(seed)

    @add(f"{tr}.slice", "SliceMapDataset", ["chute:MapDataset"])
    def _slice_map(parent: Any, sl: slice) -> Any:
        return parent.slice(sl)

    @add(f"{tr}.mix", "MixedMapDataset", ["chute:MapDataset"])
    def _mix_map(
        parents: Sequence[Any],
        proportions: Sequence[float] | None = None,
        selection_map: Any = None,
    ) -> Any:
        if selection_map is not None:
            return _map_dataset().select_from_datasets(parents, selection_map)
        return _map_dataset().mix(parents, proportions)

    @add(f"{tr}.mix", "ConcatenateMapDataset", ["chute:MapDataset"])
    def _concat_map(parents: Sequence[Any]) -> Any:
        return _map_dataset().concatenate(parents)

    @add(f"{tr}.mix", "MixedIterDataset", ["chute:IterDataset"])
    def _mix_iter(parents: Sequence[Any], proportions: Sequence[float] | None = None) -> Any:
        return _iter_dataset().mix(parents, proportions)

    @add(f"{tr}.prefetch", "PrefetchIterDataset", ["chute:IterDataset"])
    def _prefetch(parent: Any, read_options: Any = None, allow_nones: bool = False) -> Any:
        if allow_nones:
            return parent.to_iter_dataset(read_options, allow_nones=True)
        return parent.to_iter_dataset(read_options)

    @add(f"{tr}.process_prefetch", "multiprocess_prefetch", ["chute:IterDataset"])
    def _multiprocess_prefetch(
        ds: Any,
        num_workers: int = 0,
        buffer_size: int = 1,
        worker_init_fn: Any = None,
        sequential_slice: bool = False,
    ) -> Any:
        # Grain's second implementation of `IterDataset.mp_prefetch`, with the options
        # spread out as arguments.
        if num_workers == 0:
            return ds
        options = _chute("chute:MultiprocessingOptions")(
            num_workers=num_workers, per_worker_buffer_size=buffer_size
        )
        return ds.mp_prefetch(
            options, worker_init_fn=worker_init_fn, sequential_slice=sequential_slice
        )

    @add(f"{tr}.process_prefetch", "ProcessPrefetchIterDataset", ["chute:IterDataset"])
    def _process_prefetch(parent: Any, buffer_size: int, worker_init_fn: Any = None) -> Any:
        # Grain's prefetch of a whole `IterDataset` in one background process: chute's
        # `mp_prefetch` with one worker.
        options = _chute("chute:MultiprocessingOptions")(
            num_workers=1, per_worker_buffer_size=buffer_size
        )
        init = None if worker_init_fn is None else (lambda i, n: worker_init_fn())
        return parent.mp_prefetch(options, worker_init_fn=init)

    return out


class _Absent:
    """Stands for a Grain class chute has no counterpart to, so that the test files that
    name it (in an annotation, as a base class) still load; making one raises."""

    _grain_name = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"chute has no counterpart to Grain's {self._grain_name} (docs/grain_differences.md)"
        )


def _absent(name: str) -> type:
    return type(name, (_Absent,), {"_grain_name": name})


def _tree_lib() -> types.SimpleNamespace:
    """Grain's private pytree helpers, which its tests use to build and compare expected
    values: here from `jax.tree_util` (Grain's own choice when JAX is installed)."""
    import jax

    tu = jax.tree_util

    def _path(path: Any) -> tuple[Any, ...]:
        out = []
        for k in path:
            for attr in ("key", "idx", "name"):
                if hasattr(k, attr):
                    out.append(getattr(k, attr))
                    break
        return tuple(out)

    def map_structure_with_path(fn: Any, *trees: Any) -> Any:
        return tu.tree_map_with_path(lambda p, *x: fn(_path(p), *x), *trees)

    def flatten_with_path(tree: Any) -> list[tuple[tuple[Any, ...], Any]]:
        return [(_path(p), leaf) for p, leaf in tu.tree_flatten_with_path(tree)[0]]

    def unflatten_as(structure: Any, flat: Any) -> Any:
        return tu.tree_unflatten(tu.tree_structure(structure), list(flat))

    def assert_same_structure(a: Any, b: Any) -> None:
        if str(tu.tree_structure(a)) != str(tu.tree_structure(b)):
            raise ValueError(f"{a!r} and {b!r} differ in structure")

    return types.SimpleNamespace(
        map_structure=tu.tree_map,
        map_structure_with_path=map_structure_with_path,
        flatten=tu.tree_leaves,
        flatten_with_path=flatten_with_path,
        unflatten_as=unflatten_as,
        assert_same_structure=assert_same_structure,
    )


def get_non_sequence_meta_features(length_struct: Any, meta_features: Sequence[str]) -> list[str]:
    """Grain's helper that its packing tests use to build their expected elements: the
    meta features that are not keys of `length_struct` (kept as given, not arrays)."""
    keys = {path[0] for path, _ in _tree_lib().flatten_with_path(length_struct) if path}
    return [k for k in meta_features if k not in keys]


# Names that need more than a lookup: per Grain module, a name and the object for it.
def _special(grain_module: str, name: str) -> Any:
    if name == "tree_lib":
        return importlib.import_module("grain._src.core.tree_lib")
    if grain_module == "grain._src.core.tree_lib":
        try:
            return getattr(_tree_lib(), name)
        except AttributeError:
            raise KeyError(name) from None
    if name in _STAND_INS.get(grain_module, {}):
        return _STAND_INS[grain_module][name]()
    raise KeyError(name)


_STAND_INS: dict[str, dict[str, Callable[[], Any]]] = {
    "grain._src.core.transforms": {"TfRandomMap": lambda: _absent("TfRandomMap")},
    "grain._src.python.dataset.base": {
        "MultiprocessingContext": lambda: _absent("MultiprocessingContext"),
        "IteratorContext": lambda: _absent("IteratorContext"),
    },
    "grain._src.python.dataset.transformations.batch": {
        # A type alias in Grain.
        "BatchFn": lambda: Callable[[Sequence[Any]], Any],
        # The default batch function: chute's is what `as_batch_fn(None)` gives.
        "make_batch": lambda: _chute("chute._src.core.transforms:as_batch_fn")(None),
    },
    "grain._src.python.dataset.transformations.packing_packed_batch": {
        "get_non_sequence_meta_features": lambda: get_non_sequence_meta_features,
    },
}


_ADAPTERS: dict[str, dict[str, Any]] | None = None

# Names chute spells otherwise, per Grain module: name -> `chute.module:attr`.
_ALIASES: dict[str, dict[str, str]] = {
    "grain._src.core.config": {"config": "chute:config"},
    "grain._src.python.grain_logging": {},
    "grain._src.python.testing.experimental": {},
    "grain._src.python.data_sources": {
        "SharedMemoryDataSource": "chute.sources:SharedMemoryDataSource",
    },
    "grain._src.core.transforms": {"FlatMap": "chute.experimental:FlatMapTransform"},
}

# Names of Grain's private helpers and the name chute's internal one has.
_INTERNAL_RENAMES: dict[str, dict[str, str]] = {
    "grain._src.core.sharding": {"even_split": "even_split_bounds"},
}

# Modules whose names resolve in one chute module first.
_MODULE_FIRST: dict[str, str] = {
    "grain._src.python.testing.experimental": "chute.testing",
    "grain._src.core.config": "chute.config",
    "grain._src.core.sharding": "chute.sharding",
    "grain._src.python.record": "chute.python",
    "grain._src.python.samplers": "chute.samplers",
    "grain._src.python.options": "chute.python",
    "grain._src.python.data_loader": "chute.python",
    "grain._src.python.load": "chute",
    "grain._src.core.transforms": "chute.transforms",
    "grain._src.python.experimental.index_shuffle.python.index_shuffle_module": (
        "chute.experimental"
    ),
}

_INTERNAL_INDEX: dict[str, list[Any]] | None = None

# chute's internal packages not searched for private helpers: they need optional
# frameworks (torch, beam, orbax) or start servers on import.
_INDEX_SKIP = ("beam", "torch", "orbax", "remote", "metrics", "bench_cli", "cli")


def _internal_index() -> dict[str, list[Any]]:
    global _INTERNAL_INDEX
    if _INTERNAL_INDEX is None:
        index: dict[str, list[Any]] = {}
        pkg = importlib.import_module("chute._src")
        for info in pkgutil.walk_packages(pkg.__path__, "chute._src."):
            if any(part in info.name.split(".")[-1] for part in _INDEX_SKIP):
                continue
            if any(f".{part}." in info.name + "." for part in _INDEX_SKIP):
                continue
            try:
                module = importlib.import_module(info.name)
            except Exception:
                continue
            for attr, value in vars(module).items():
                if attr.startswith("__"):
                    continue
                if getattr(value, "__module__", None) != module.__name__:
                    continue
                index.setdefault(attr, []).append(value)
        _INTERNAL_INDEX = index
    return _INTERNAL_INDEX


class _MissingName(AttributeError):
    pass


def resolve(grain_module: str, name: str) -> Any:
    """The chute object standing for `grain_module.name`."""
    global _ADAPTERS
    if _ADAPTERS is None:
        _ADAPTERS = _build_adapters()
    if name in _ADAPTERS.get(grain_module, {}):
        return _ADAPTERS[grain_module][name]
    if name in _ALIASES.get(grain_module, {}):
        return _chute(_ALIASES[grain_module][name])
    try:
        return _special(grain_module, name)
    except KeyError:
        pass
    renamed = _INTERNAL_RENAMES.get(grain_module, {}).get(name)
    if renamed and _internal_index().get(renamed):
        return _internal_index()[renamed][0]
    first = _MODULE_FIRST.get(grain_module)
    for module_name in ((first,) if first else ()) + _PUBLIC_SEARCH:
        module = importlib.import_module(module_name)
        try:
            return getattr(module, name)
        except AttributeError:
            continue
    found = _internal_index().get(name)
    if found and len(found) > 1 and all(isinstance(f, type) for f in found):
        # Several chute classes of that name: built as the first, and `isinstance`
        # against any of them.
        return _Alternatives(name, found)
    if found:
        return found[0]
    raise _MissingName(
        f"chute has no counterpart to {grain_module}.{name} (module {grain_module!r} "
        f"answered by tests/grain_upstream/shim.py)"
    )


_GRAIN_MODULES: frozenset[str] | None = None


def _grain_modules() -> frozenset[str]:
    """The names of Grain's modules, as the runner listed them from Grain's files."""
    global _GRAIN_MODULES
    if _GRAIN_MODULES is None:
        listing = os.path.join(os.environ.get(ROOT_ENV, ""), MODULE_LIST)
        with open(listing) as f:
            _GRAIN_MODULES = frozenset(line.strip() for line in f if line.strip())
    return _GRAIN_MODULES


class _GrainModule(types.ModuleType):
    """A Grain module whose attributes are looked up in chute on first use; a submodule
    of Grain's is imported (through this finder) rather than looked up."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        submodule = f"{self.__name__}.{name}"
        if submodule in _grain_modules():
            return importlib.import_module(submodule)
        value = resolve(self.__name__, name)
        setattr(self, name, value)
        return value


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _GrainModule(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        root = os.environ.get(ROOT_ENV, "")
        parts = module.__name__.split(".")
        module.__file__ = os.path.join(root, *parts, "__init__.py")
        module.__path__ = [os.path.join(root, *parts)]  # every Grain module is a package here
        if module.__name__ == "grain":
            module.__dict__["__version__"] = "0.2.18"
        if module.__name__ == "grain._src.python.grain_logging":
            module.set_process_identifier_prefix = _set_process_identifier_prefix  # type: ignore[attr-defined]
        if module.__name__ in _PUBLIC_MODULES:
            target = importlib.import_module(_PUBLIC_MODULES[module.__name__])
            module.__doc__ = target.__doc__


def _set_process_identifier_prefix(prefix: str) -> None:
    """Grain prefixes its absl log lines with the process's name; chute logs through
    Python's `logging` with the names of its loggers."""
    logging.getLogger().handlers  # noqa: B018 (the root logger exists)
    del prefix


class GrainFinder(importlib.abc.MetaPathFinder):
    """Answers `grain` and every `grain.*` module; Grain's test-code modules are loaded
    from their files under the root."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "grain" and not fullname.startswith("grain."):
            return None
        if fullname in TEST_CODE_MODULES:
            root = os.environ.get(ROOT_ENV, "")
            file = os.path.join(root, *fullname.split(".")) + ".py"
            return importlib.util.spec_from_file_location(fullname, file)
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)


def install() -> None:
    if not any(isinstance(f, GrainFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, GrainFinder())
