"""`chute.torch.to_tensors` and `pin_memory`: chute's numpy batches as torch tensors.

`torch.from_numpy` makes a tensor that shares the array's memory and holds a reference to
the array, so converting costs no copy, and an array that `mp_prefetch` handed over as a
view into a worker's shared-memory slab stays valid while the tensor lives (the slab
region is reused only once every array viewing it is gone).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

try:
    import torch
except ImportError as e:  # pragma: no cover - the torch extra is installed for the tests
    raise ImportError(
        "chute.torch needs PyTorch, which is not installed: pip install 'chute[torch]'."
    ) from e

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


def pin_memory(tree: Any) -> Any:
    """`tree` with every tensor (and numeric numpy array, converted by `to_tensors`) copied
    into page-locked memory, so `tensor.to("cuda", non_blocking=True)` copies
    asynchronously. Pinning is a CUDA feature: without a CUDA device it does nothing
    and warns once (as `torch.utils.data.DataLoader(pin_memory=True)` does), returning
    `tree` as `to_tensors` gives it.
    """
    global _warned_no_cuda
    tree = to_tensors(tree)
    if not torch.cuda.is_available():
        if not _warned_no_cuda:
            _warned_no_cuda = True
            warnings.warn(
                "chute.torch.pin_memory: no CUDA device is available, so nothing is pinned "
                "(tensors stay in ordinary memory); drop pin_memory on a CPU-only machine.",
                RuntimeWarning,
                stacklevel=2,
            )
        return tree
    return _pin(tree)


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
