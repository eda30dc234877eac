"""The worker wing: the `mp_prefetch` stage, the rewrite that moves a pipeline into workers, feeding chunks to them, the service that routes their results, shards of streams, and start-up."""
