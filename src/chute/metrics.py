"""Per-stage metrics of running pipelines, sent to a callback or to Prometheus.

- `export(callback, interval_s=10.0)`: `callback(stats)` gets a `chute.PipelineStats`
  (the figures of the debug summary: per stage elements, elements/s, own time, share of
  the consumer's waiting, CPU share, buffer occupancy) of every iterator created while
  the export is open, every `interval_s` seconds and when the iterator ends. Returns an
  `Export` to `close()` (or use as a `with` block). Nothing runs, and nothing of it is
  imported, while no export is open.
- `PrometheusExporter(pipeline="default", registry=None)`: a callback serving the latest
  figures to a `prometheus_client` registry (the `[metrics]` extra:
  `pip install 'chute[metrics]'`).

See docs/metrics.md (TensorBoard too).
"""

from chute._src.debug.metrics.export import Export as Export
from chute._src.debug.metrics.export import export as export
from chute._src.debug.metrics.prometheus import PrometheusExporter as PrometheusExporter

__all__ = ["Export", "PrometheusExporter", "export"]
