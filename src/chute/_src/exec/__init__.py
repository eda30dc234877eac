"""How a pipeline is computed: chunk executors, the reader of a MapDataset, prefetching on threads, autotuning, and (in `workers/` and `mp/`) worker processes."""
