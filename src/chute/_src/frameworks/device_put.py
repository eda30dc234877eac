"""`experimental.device_put`: elements moved to JAX devices ahead of the consumer.

Two background threads, as in Grain: one computes the pipeline `cpu_buffer_size` elements
ahead on the host; the other takes those host elements and starts their host-to-device
transfers (`jax.device_put` is asynchronous: it returns while the copy runs), keeping
`device_buffer_size` elements on the device ahead of the consumer. So while the training
step runs, the next batches are computed and copied.

The stage is `PREFETCH`: its iterator is transparent, and each background thread records
the state of the stages below with every element, so `get_state()` is the position of the
element the consumer sees next, whatever is buffered on the host or the device. Restoring
drops both buffers and recomputes from that position.

`make_global_arrays` is the multi-host half: each process holds its own part of a batch
(sharded by `jax.process_index()`), and `jax.make_array_from_process_local_data` makes
one global `jax.Array` of them per leaf. `device_put(..., process_local=True)` does that
for every element, in the transfer thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.exec.thread_prefetch import prefetch_iterator
from chute._src.frameworks.sharding import import_jax

T = TypeVar("T")


def make_global_arrays(tree: Any, sharding: Any) -> Any:
    """`tree` with every array leaf made one global `jax.Array` over `sharding`, from this
    process's part of it: `jax.make_array_from_process_local_data(sharding, leaf)`.

    Each process passes its own batch (its shard of the data, e.g. read with
    `chute.sharding.shard_by_jax_process()`); the global array is the processes' batches
    along the dimensions `sharding` splits across processes, in process order. With one
    process it is `jax.device_put(tree, sharding)`.

    >>> import jax, numpy as np
    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    >>> arrays = make_global_arrays({"x": np.arange(4)}, NamedSharding(mesh, PartitionSpec("data")))
    >>> arrays["x"].shape
    (4,)
    """
    jax = import_jax("make_global_arrays")
    if not isinstance(sharding, jax.sharding.Sharding):
        raise TypeError(
            f"make_global_arrays: sharding={sharding!r} is not a jax.sharding.Sharding: pass "
            "the sharding of the global batch, e.g. NamedSharding(mesh, PartitionSpec('data'))."
        )
    return jax.tree.map(lambda leaf: jax.make_array_from_process_local_data(sharding, leaf), tree)


class _Put:
    """`element -> its arrays on the device(s)`: `jax.device_put(element, device)`, or the
    global arrays of `make_global_arrays` with `process_local`."""

    def __init__(self, device: Any, process_local: bool) -> None:
        self.device = device
        self.process_local = process_local

    def __call__(self, element: Any) -> Any:
        import jax

        try:
            if self.process_local:
                return make_global_arrays(element, self.device)
            return jax.device_put(element, self.device)
        except (TypeError, ValueError) as e:
            leaves = ", ".join(sorted({type(x).__name__ for x in jax.tree.leaves(element)}))
            e.add_note(
                f"chute: device_put could not move an element (leaves: {leaves}) to "
                f"{self.device!r}: an element must be a tree (dicts, lists, tuples) of numbers "
                "and numeric arrays, with shapes the device or sharding can hold; drop other "
                "fields (strings, ids) with a map before device_put."
            )
            raise


class _PutIterator(DatasetIterator[Any]):
    """Each element of `parent` put on the device; transparent (the value is unchanged,
    only where it lives)."""

    stage = "device_put"
    transparent = True

    def __init__(self, parent: DatasetIterator[Any], put: Callable[[Any], Any]) -> None:
        super().__init__(parent)
        self._put = put

    def __next__(self) -> Any:
        return self._put(next(self._parent))


class DevicePutIterDataset(IterDataset[Any]):
    """`parent`'s elements as `jax.Array`s on `device`, computed and transferred ahead."""

    def __init__(
        self,
        parent: IterDataset[Any],
        device: Any,
        *,
        cpu_buffer_size: int,
        device_buffer_size: int,
        process_local: bool,
    ) -> None:
        super().__init__([parent])
        if not isinstance(parent, IterDataset):
            raise TypeError(
                f"device_put: ds={parent!r} is not an IterDataset: call .to_iter_dataset() "
                "on a MapDataset first."
            )
        for name, value in (
            ("cpu_buffer_size", cpu_buffer_size),
            ("device_buffer_size", device_buffer_size),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"device_put: {name}={value!r} is invalid: it must be an int >= 0 (the "
                    "number of elements kept ahead; 0 turns that buffer off)."
                )
        jax = import_jax("device_put")
        if isinstance(device, (str, bytes, int, float)):
            raise TypeError(
                f"device_put: device={device!r} is not a device: pass a jax.Device (e.g. "
                "jax.devices()[0]) or a jax.sharding.Sharding (e.g. NamedSharding(mesh, "
                "PartitionSpec('data')))."
            )
        if process_local and not isinstance(device, jax.sharding.Sharding):
            raise TypeError(
                f"device_put: process_local=True needs device to be a jax.sharding.Sharding "
                f"over the devices of every process, not {device!r}: e.g. "
                "NamedSharding(Mesh(jax.devices(), ('data',)), PartitionSpec('data'))."
            )
        self._device = device
        self._cpu_buffer_size = cpu_buffer_size
        self._device_buffer_size = device_buffer_size
        self._process_local = process_local

    _role = StageRole.PREFETCH

    @property
    def _concurrent(self) -> bool:
        return bool(self._cpu_buffer_size or self._device_buffer_size)

    def _make_iterator(self) -> DatasetIterator[Any]:
        host = prefetch_iterator(self._parent_iter(), self._cpu_buffer_size)
        put = _PutIterator(host, _Put(self._device, self._process_local))
        return prefetch_iterator(put, self._device_buffer_size)

    def __repr__(self) -> str:
        local = ", process_local=True" if self._process_local else ""
        return (
            f"DevicePutIterDataset(device={self._device!r}, cpu_buffer_size="
            f"{self._cpu_buffer_size}, device_buffer_size={self._device_buffer_size}{local})"
        )


def device_put(
    ds: IterDataset[Any],
    device: Any,
    *,
    cpu_buffer_size: int = 4,
    device_buffer_size: int = 2,
    process_local: bool = False,
) -> IterDataset[Any]:
    """`ds`'s elements as `jax.Array`s on `device`, prefetched on the host and on the device.

    `device` is what `jax.device_put` takes: a device or a `jax.sharding.Sharding` (a batch
    is then split across the sharding's devices). A thread computes `ds`
    `cpu_buffer_size` elements ahead; another starts each element's transfer to the device
    `device_buffer_size` elements ahead, so copies overlap the training step. The state is
    `ds`'s, at the element the consumer gets next: buffered elements are recomputed after
    a restore, never lost.

    With `process_local=True` (multi-host), each process's elements are its part of the
    global batch and `device` a sharding over every process's devices: each element
    becomes global arrays through `make_global_arrays`.

    >>> import chute, jax
    >>> ds = chute.MapDataset.range(8).batch(4).to_iter_dataset()
    >>> batches = list(chute.experimental.device_put(ds, jax.devices()[0]))
    >>> type(batches[0]).__name__, batches[1].tolist()
    ('ArrayImpl', [4, 5, 6, 7])
    """
    return DevicePutIterDataset(
        ds,
        device,
        cpu_buffer_size=cpu_buffer_size,
        device_buffer_size=device_buffer_size,
        process_local=process_local,
    )
