"""`experimental.device_put`: elements moved to JAX devices ahead of the consumer."""

from __future__ import annotations

from typing import Any, TypeVar

from chute._src.dataset import IterDataset
from chute._src.iter.thread_prefetch import ThreadPrefetchIterDataset

T = TypeVar("T")


class _Put:
    """Picklable `element -> jax.device_put(element, device)`."""

    def __init__(self, device: Any) -> None:
        self._device = device

    def __call__(self, element: Any) -> Any:
        try:
            import jax
        except ImportError as e:
            raise ImportError("device_put needs JAX: pip install 'chute[jax]'.") from e
        return jax.device_put(element, self._device)


def device_put(
    ds: IterDataset[Any],
    device: Any,
    *,
    cpu_buffer_size: int = 4,
    device_buffer_size: int = 2,
) -> IterDataset[Any]:
    """`ds` computed `cpu_buffer_size` elements ahead in a thread, each element put on
    `device` (a device or a sharding) `device_buffer_size` elements ahead in another."""
    ahead = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=cpu_buffer_size)
    return ThreadPrefetchIterDataset(
        ahead.map(_Put(device)), prefetch_buffer_size=device_buffer_size
    )
