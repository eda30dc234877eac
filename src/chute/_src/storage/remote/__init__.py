"""Object storage: URLs, the obstore and fsspec clients, the block cache and ranged reads."""
