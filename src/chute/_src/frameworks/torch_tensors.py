"""`chute.torch.to_tensors` and `pin_memory`: chute's numpy batches as torch tensors.

`torch.from_numpy` makes a tensor that shares the array's memory and holds a reference to
the array, so converting costs no copy, and an array that `mp_prefetch` handed over as a
view into a worker's shared-memory slab stays valid while the tensor lives (the slab
region is reused only once every array viewing it is gone).

`pin_memory(ds)` pins in a background thread, as torch's `DataLoader(pin_memory=True)`
does: the thread advances the pipeline, converts each batch and copies it into
page-locked memory, `buffer_size` batches ahead of the loop (`thread_prefetch`'s
bounded queue, which keeps the order, hands an exception over at its position, and
records the pipeline's state with every batch, so `get_state()` is the position after
the last batch the loop received, not after those pinned ahead).
"""

from __future__ import annotations

import warnings
from typing import Any, TypeVar, overload

import numpy as np

from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.iterator import DatasetIterator, ThreadGuardedIterator
from chute._src.exec.thread_prefetch import prefetch_iterator

try:
    import torch
except ImportError as e:  # pragma: no cover - the torch extra is installed for the tests
    raise ImportError(
        "chute.torch needs PyTorch, which is not installed: pip install 'chute[torch]'."
    ) from e

T = TypeVar("T")

_NUMERIC = frozenset("biufc")  # bool, int, uint, float, complex: what torch holds


def _tensor(array: np.ndarray) -> Any:
    if array.dtype.kind not in _NUMERIC:
        return array  # strings, objects, dates: torch has no tensor for them
    if not array.flags.writeable or any(s < 0 for s in array.strides):
        # A tensor is writable: sharing read-only memory (a memory-mapped file) would let
        # a write fault; negative strides (a flipped view) torch cannot express.
        array = np.array(array)
    return torch.from_numpy(array)


def to_tensors(tree: Any) -> Any:
    """`tree` (dicts, lists, tuples, named tuples of numpy arrays) with every numeric array
    a `torch.Tensor` sharing its memory (`torch.from_numpy`: no copy), and every numpy
    scalar a 0-d tensor. Arrays torch cannot share are copied: read-only ones (tensors are
    writable) and ones with negative strides (flipped views). Other leaves (strings,
    Python numbers, tensors) are returned as they are.

    >>> import numpy as np
    >>> batch = {"ids": np.arange(3), "label": np.float32(1.5), "name": "a"}
    >>> out = to_tensors(batch)
    >>> out["ids"], out["label"], out["name"]
    (tensor([0, 1, 2]), tensor(1.5000), 'a')
    >>> out["ids"][0] = 7; batch["ids"][0].item()  # the same memory
    7
    """
    if isinstance(tree, np.ndarray):
        return _tensor(tree)
    if isinstance(tree, np.generic):
        return _tensor(np.asarray(tree)) if tree.dtype.kind in _NUMERIC else tree
    if isinstance(tree, dict):
        return {k: to_tensors(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a named tuple
        return type(tree)(*(to_tensors(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_tensors(v) for v in tree)
    return tree


_warned_no_cuda = False


def _cuda_or_warn(stacklevel: int = 3) -> bool:
    """Whether CUDA is available; warns once per process when it is not (`stacklevel`:
    the caller of `pin_memory` from here)."""
    global _warned_no_cuda
    if torch.cuda.is_available():
        return True
    if not _warned_no_cuda:
        _warned_no_cuda = True
        warnings.warn(
            "chute.torch.pin_memory: no CUDA device is available, so nothing is pinned "
            "(tensors stay in ordinary memory); drop pin_memory on a CPU-only machine.",
            RuntimeWarning,
            stacklevel=stacklevel,
        )
    return False


@overload
def pin_memory(tree: IterDataset[Any], *, buffer_size: int | None = None) -> IterDataset[Any]: ...


@overload
def pin_memory(
    tree: DatasetIterator[Any], *, buffer_size: int | None = None
) -> DatasetIterator[Any]: ...


@overload
def pin_memory(tree: Any) -> Any: ...


def pin_memory(tree: Any, *, buffer_size: int | None = None) -> Any:
    """Page-locked copies of a batch's tensors, or of every batch of a dataset or iterator
    pinned ahead of the loop in a background thread.

    Given a batch (dicts, lists, tuples, named tuples of tensors and numeric numpy
    arrays, converted by `to_tensors`), its tensors copied into page-locked memory, so
    that `tensor.to("cuda", non_blocking=True)` copies asynchronously.

    Given an `IterDataset` (or a chute `DatasetIterator`, which it then takes over: its
    `close()` closes it), the same for every element, done in a background thread
    `buffer_size` elements (default 2) ahead of the loop, as
    `torch.utils.data.DataLoader(pin_memory=True)` does: the thread advances the pipeline
    too, so its work overlaps the training step. Order and checkpoints are kept: the
    state is the position after the last element the loop received, and an exception
    comes out where the element that raised it would have. `buffer_size=0` pins in the
    loop's thread.

    Pinning is a CUDA feature: without a CUDA device nothing is pinned, a warning says so
    once, and the tensors come out as `to_tensors` gives them.

    >>> import chute, warnings
    >>> ds = chute.MapDataset.range(6).batch(3).to_iter_dataset()
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")  # no CUDA here: nothing is pinned
    ...     batches = pin_memory(ds)
    >>> [b.tolist() for b in batches]
    [[0, 1, 2], [3, 4, 5]]
    """
    if isinstance(tree, IterDataset):
        return PinMemoryIterDataset(tree, buffer_size=_buffer_size(buffer_size))
    if isinstance(tree, DatasetIterator):
        size = _buffer_size(buffer_size)
        return ThreadGuardedIterator(prefetch_iterator(_PinIterator(tree, _cuda_or_warn()), size))
    if isinstance(tree, MapDataset):
        raise TypeError(
            f"pin_memory: {tree!r} is a MapDataset: call .to_iter_dataset() first (batches "
            "are pinned ahead of the loop as an iterable dataset produces them)."
        )
    if buffer_size is not None:
        raise TypeError(
            f"pin_memory: buffer_size={buffer_size!r} applies to a dataset or iterator pinned "
            f"in the background, not to one batch (a {type(tree).__name__}); drop it, or "
            "pass the IterDataset the batches come from."
        )
    tree = to_tensors(tree)
    return _pin(tree) if _cuda_or_warn() else tree


def _buffer_size(value: int | None) -> int:
    if value is None:
        return 2
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"pin_memory: buffer_size={value!r} is invalid: it must be an int >= 0 (the "
            "number of batches pinned ahead of the loop; 0 pins in the loop's thread)."
        )
    return value


class _PinIterator(DatasetIterator[Any]):
    """Each element of `parent` as tensors in page-locked memory (as `to_tensors` gives
    them without CUDA). Transparent: only where the element lives changes."""

    stage = "pin_memory"
    transparent = True

    def __init__(self, parent: DatasetIterator[Any], pin: bool) -> None:
        super().__init__(parent)
        self._pin = pin
        # torch's pinning thread runs on the loop's current device (the pinned memory's
        # CUDA context); a new thread starts on device 0.
        self._device = torch.cuda.current_device() if pin else None
        self._device_set = False

    def __next__(self) -> Any:
        tree = to_tensors(next(self._parent))
        if not self._pin:
            return tree
        if not self._device_set:
            torch.cuda.set_device(self._device)
            self._device_set = True
        return _pin(tree)


class PinMemoryIterDataset(IterDataset[Any]):
    """`parent`'s elements as tensors in page-locked memory, pinned `buffer_size` ahead
    in a background thread (`chute.torch.pin_memory(ds)`)."""

    def __init__(self, parent: IterDataset[Any], *, buffer_size: int) -> None:
        super().__init__([parent])
        self._size = buffer_size
        _cuda_or_warn(stacklevel=4)

    _role = StageRole.PREFETCH

    @property
    def _concurrent(self) -> bool:
        return self._size > 0

    def _make_iterator(self) -> DatasetIterator[Any]:
        pin = torch.cuda.is_available()
        return prefetch_iterator(_PinIterator(self._parent_iter(), pin), self._size)

    def __repr__(self) -> str:
        return f"PinMemoryIterDataset(buffer_size={self._size})"


def _pin(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.pin_memory()
    if isinstance(tree, dict):
        return {k: _pin(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(_pin(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(_pin(v) for v in tree)
    return tree
