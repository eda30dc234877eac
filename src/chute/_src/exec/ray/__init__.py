"""`mp_prefetch` on a Ray cluster: `chute.ray.RayWorkers` (docs/ray.md).

- `options.py`: `RayWorkers`, the options (a `MultiprocessingOptions`); imports no Ray.
- `connect.py`: importing Ray (the `[ray]` extra) and connecting to a cluster.
- `actor.py`: the actor each worker is, running `workers.worker.ChunkWorker` as it is.
- `pool.py`: the actors of one iterator: started, chosen, replaced when they die, retired.
- `fetch.py`: results pulled to the consumer's node as soon as they are computed.
- `service.py`: `RayService`, the chunk service `mp_prefetch`'s readers and shard streams
  are fed by (the interface of `workers.service.ChunkService`), and `resize`.
"""
