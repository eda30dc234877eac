"""Per-stage metrics export: the hook (`export.py`) and a Prometheus exporter."""
