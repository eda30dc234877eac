"""chute's implementation. Nothing here is public: import from `chute` instead."""
