"""`PrometheusExporter`: the per-stage figures as Prometheus metrics (`prometheus_client`).

A callback for `chute.metrics.export` that keeps the latest figures and a collector that
Prometheus's registry asks for them at every scrape, so a metric is never older than the
export's interval. Series, labelled `pipeline` (the exporter's), `stage_index` (the
stage's place in the pipeline as written, sources first) and `stage` (its kind:
`Shuffle`, `Filter`, `Batch`, ...). The labels are the same for every iterator of the
pipeline and for any number of workers (stages moved into workers, shards read in them,
keep their place; the engine's own stages are not listed), and never hold a file, a line
or a function, so editing a script keeps its series:

- `chute_stage_elements_total` (counter): elements the stage produced;
- `chute_stage_busy_seconds_total` (counter): the stage's own time (its inputs' left out);
- `chute_stage_elements_per_second`, `chute_stage_wait_ratio` (the share, 0 to 1, of the
  consumer's waiting attributed to the stage), `chute_stage_cpu_ratio`,
  `chute_stage_buffered_elements`, `chute_stage_buffered_bytes`, `chute_stage_bottleneck`
  (1 for the stage the consumer waits on most) (gauges; a figure not known yet is left
  out);
- `chute_consumer_waiting_ratio` (gauge, `pipeline` only): the share of the consumer's
  time spent waiting for data since its first element.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from chute._src.debug.stats import PipelineStats

__all__ = ["PrometheusExporter"]


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as e:
        raise ImportError(
            "chute.metrics.PrometheusExporter needs prometheus_client: pip install 'chute[metrics]'"
        ) from e
    return prometheus_client


class PrometheusExporter:
    """Serves the latest figures `chute.metrics.export` sends it to Prometheus.

    Registered in `registry` (prometheus_client's default `REGISTRY` if None) when made;
    serve it as any prometheus_client registry (`prometheus_client.start_http_server`,
    or `generate_latest(registry)`). `pipeline` labels every series, so several pipelines
    (each with its own export and exporter) share one registry. `close()` unregisters it.
    """

    def __init__(
        self, pipeline: str = "default", *, registry: Any = None, namespace: str = "chute"
    ) -> None:
        client = _client()
        self.pipeline = pipeline
        self.namespace = namespace
        self._registry = client.REGISTRY if registry is None else registry
        self._latest: PipelineStats | None = None
        self._lock = threading.Lock()
        self._registry.register(self)

    def __call__(self, stats: PipelineStats) -> None:
        with self._lock:
            self._latest = stats

    def close(self) -> None:
        """Unregisters the collector: its series disappear from the registry."""
        self._registry.unregister(self)

    def describe(self) -> list[Any]:
        """The metric families without samples (the registry checks names with them)."""
        return list(self._families(None))

    def collect(self) -> Iterator[Any]:
        """What the registry asks at each scrape: the latest figures."""
        with self._lock:
            latest = self._latest
        yield from self._families(latest)

    def _families(self, stats: PipelineStats | None) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        ns = self.namespace
        by_stage = ["pipeline", "stage_index", "stage"]

        def counter(name: str, doc: str) -> Any:
            return CounterMetricFamily(f"{ns}_stage_{name}", doc, labels=by_stage)

        def gauge(name: str, doc: str) -> Any:
            return GaugeMetricFamily(f"{ns}_stage_{name}", doc, labels=by_stage)

        elements = counter("elements", "Elements the stage produced.")
        busy = counter("busy_seconds", "The stage's own time, its inputs' left out.")
        rate = gauge("elements_per_second", "Elements per second of the stage's own time.")
        wait = gauge("wait_ratio", "Share of the consumer's waiting attributed to the stage.")
        cpu = gauge("cpu_ratio", "Time on a CPU over the stage's own time, less time queued.")
        buffered = gauge("buffered_elements", "Elements a prefetch stage holds ready.")
        buffered_bytes = gauge("buffered_bytes", "Bytes of the elements a prefetch stage holds.")
        bottleneck = gauge("bottleneck", "1 for the stage the consumer waits on most, else 0.")
        consumer = GaugeMetricFamily(
            f"{ns}_consumer_waiting_ratio",
            "Share of the consumer's time spent waiting for data since its first element.",
            labels=["pipeline"],
        )
        if stats is not None:
            slowest = stats.bottleneck
            for index, s in enumerate(stats.stages):
                at = [self.pipeline, str(index), s.stage]
                elements.add_metric(at, s.elements)
                busy.add_metric(at, s.self_s)
                wait.add_metric(at, s.wait_percent / 100)
                bottleneck.add_metric(at, float(slowest is not None and slowest.id == s.id))
                if s.elements_per_s is not None:
                    rate.add_metric(at, s.elements_per_s)
                if s.cpu_percent is not None:
                    cpu.add_metric(at, s.cpu_percent / 100)
                if s.buffered_elements is not None:
                    buffered.add_metric(at, s.buffered_elements)
                    buffered_bytes.add_metric(at, s.buffered_bytes or 0)
            waiting = stats.waiting_percent
            if waiting is not None:
                consumer.add_metric([self.pipeline], waiting / 100)
        yield from (elements, busy, rate, wait, cpu, buffered, buffered_bytes, bottleneck)
        yield consumer

    def __repr__(self) -> str:
        return f"PrometheusExporter(pipeline={self.pipeline!r})"
