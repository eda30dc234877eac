"""chute's workers on a Ray cluster (the `[ray]` extra): `pip install 'chute[ray]'`.

- `RayWorkers(num_workers=..., address=None, resources_per_worker=..., ...)`: options
  accepted wherever `MultiprocessingOptions` are (`ds.mp_prefetch(RayWorkers(32))`, the
  `DataLoader`'s `multiprocessing_options`): Ray actors compute chunks of element indices
  (and the shards of streams); results come back through Ray's object store, in order,
  with at most `max_chunks_in_flight` chunks per reader asked for ahead. The output and
  the states are those of the same pipeline with local workers or with none.
- `resize(iterator, num_workers)`: more actors, or fewer, while iterating.

A lost actor (killed, its node removed) is replaced and its chunks are computed again
elsewhere; actors end with this process's Ray job. See docs/ray.md.
"""

from chute._src.exec.ray.connect import require_ray as _require_ray

_require_ray()  # an ImportError naming the extra, here rather than at the first iterator

from chute._src.exec.ray.options import RayWorkers as RayWorkers  # noqa: E402
from chute._src.exec.ray.service import resize as resize  # noqa: E402

__all__ = ["RayWorkers", "resize"]
