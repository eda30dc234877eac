"""chute inside other systems: the DataLoader and its samplers and operations, sharding, PyTorch, JAX device feed, Orbax, elastic resume."""
