"""The sidecar's own Prometheus metrics, computed from the monitor at scrape time.

A custom collector (as ``prometheus_client`` recommends for values that live elsewhere) reads
the :class:`~sidecar.monitor.monitor.Monitor` whenever Prometheus scrapes, so nothing is copied
on the hot path and nothing goes stale between scrapes. Everything is registered on an explicit
``CollectorRegistry``; the library's global registry is never used. Names, units and labels are
listed in the README ("Metrics").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar import __version__
from sidecar.admission.outcomes import Lane
from sidecar.monitor.diagnose import DiagnosisId, Severity
from sidecar.monitor.monitor import Monitor

_DIAGNOSIS_IDS = tuple(DiagnosisId)  # every id is exported, 0 while inactive


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"kv_sidecar_{name}", doc, labels=list(labels))


class MonitorCollector(Collector):
    """Engine, prediction, GPU and diagnosis gauges, read from the monitor at collection time."""

    def __init__(self, monitor: Monitor, clock: Callable[[], float]) -> None:
        self._monitor = monitor
        self._clock = clock

    def _engine(self) -> Iterator[Metric]:
        engine = self._monitor.engine
        snapshot = engine.snapshot
        up = _gauge("engine_up", "1 when the last scrape of the engine's /metrics succeeded, else 0.")
        up.add_metric([], 1.0 if engine.up else 0.0)
        yield up
        age = _gauge(
            "engine_metrics_age_seconds", "Seconds since the engine's metrics were last read successfully."
        )
        value = engine.metrics_age(self._clock())
        age.add_metric([], math.inf if value is None else value)
        yield age
        usage = _gauge(
            "engine_kv_cache_usage_ratio", "Engine KV-cache usage (0..1); the most saturated engine."
        )
        requests = _gauge(
            "engine_requests", "Engine requests by state (running, waiting, swapped).", ("state",)
        )
        preemptions = CounterMetricFamily(
            "kv_sidecar_engine_preemptions", "Engine preemptions since it started (vLLM's counter, summed)."
        )
        if snapshot is not None:
            if snapshot.kv_usage is not None:
                usage.add_metric([], snapshot.kv_usage)
            for state, count in (("running", snapshot.running), ("waiting", snapshot.waiting)):
                if count is not None:
                    requests.add_metric([state], count)
            if snapshot.swapped is not None:
                requests.add_metric(["swapped"], snapshot.swapped)
            if snapshot.preemptions_total is not None:
                preemptions.add_metric([], snapshot.preemptions_total)
        yield usage
        yield requests
        yield preemptions

    def _prediction(self) -> Iterator[Metric]:
        monitor = self._monitor
        ledger, comparison = monitor.ledger, monitor.comparison
        budget = _gauge("budget_bytes", "Predicted memory per GPU by component.", ("component",))
        pool = _gauge(
            "kv_pool_tokens", "KV pool size in tokens, predicted and as the engine reports.", ("source",)
        )
        concurrency = _gauge(
            "max_concurrency",
            "Full-length requests the KV pool holds: predicted, engine, and the target.",
            ("source",),
        )
        drift = _gauge("kv_pool_drift_ratio", "(engine - predicted) / predicted KV pool tokens.")
        if ledger is not None:
            for component, value in (
                ("weights", ledger.weights_bytes),
                ("kv_cache", ledger.kv_bytes_total),
                ("activation", ledger.activation_bytes),
                ("overhead", ledger.overhead_bytes),
                ("total", ledger.total_bytes),
                ("gpu_memory", ledger.gpu_memory_bytes),
                ("kv_pool", ledger.kv_pool_bytes),
            ):
                budget.add_metric([component], float(value))
        if comparison.predicted_pool_tokens is not None:
            pool.add_metric(["predicted"], float(comparison.predicted_pool_tokens))
        if comparison.engine_pool_tokens is not None:
            pool.add_metric(["engine"], float(comparison.engine_pool_tokens))
        if comparison.predicted_max_concurrency is not None:
            concurrency.add_metric(["predicted"], comparison.predicted_max_concurrency)
        if comparison.engine_max_concurrency is not None:
            concurrency.add_metric(["engine"], comparison.engine_max_concurrency)
        concurrency.add_metric(["target"], float(comparison.target_concurrency))
        if comparison.pool_drift_ratio is not None:
            drift.add_metric([], comparison.pool_drift_ratio)
        yield from (budget, pool, concurrency, drift)

    def _gpus(self) -> Iterator[Metric]:
        state = self._monitor.gpu
        nvml_up = _gauge(
            "gpu_nvml_up", "1 when NVML answered on the last read, 0 when unavailable or disabled."
        )
        nvml_up.add_metric([], 1.0 if state.available else 0.0)
        yield nvml_up
        memory = _gauge(
            "gpu_memory_bytes", "GPU memory by kind (total, used, free, reserved, peak).", ("gpu", "kind")
        )
        util = _gauge(
            "gpu_utilization_ratio", "GPU utilisation (0..1) over NVML's last sample period.", ("gpu",)
        )
        power = _gauge("gpu_power_watts", "GPU power draw.", ("gpu",))
        temperature = _gauge("gpu_temperature_celsius", "GPU core temperature.", ("gpu",))
        for gpu in state.gpus:
            index = str(gpu.index)
            for kind, value in (
                ("total", gpu.total_bytes),
                ("used", gpu.used_bytes),
                ("free", gpu.free_bytes),
                ("reserved", gpu.reserved_bytes),
                ("peak", state.peak_used_bytes.get(gpu.index)),
            ):
                if value is not None:
                    memory.add_metric([index, kind], float(value))
            for family, reading in ((util, gpu.utilization_ratio), (power, gpu.power_watts)):
                if reading is not None:
                    family.add_metric([index], reading)
            if gpu.temperature_celsius is not None:
                temperature.add_metric([index], gpu.temperature_celsius)
        yield from (memory, util, power, temperature)

    def _diagnoses(self) -> Iterator[Metric]:
        active = {d.id for d in self._monitor.diagnoses}
        family = _gauge(
            "diagnosis_active", "1 while the diagnosis with this stable id holds, else 0.", ("id",)
        )
        for diagnosis_id in _DIAGNOSIS_IDS:
            family.add_metric([diagnosis_id.value], 1.0 if diagnosis_id in active else 0.0)
        yield family
        counts = _gauge("diagnoses", "Diagnoses holding now, by severity.", ("severity",))
        for severity in Severity:
            counts.add_metric(
                [severity.value], float(sum(d.severity is severity for d in self._monitor.diagnoses))
            )
        yield counts

    def collect(self) -> Iterator[Metric]:
        """Yield every family (called by the registry at scrape time)."""
        info = _gauge("build_info", "Always 1; the version label says which kv-sidecar runs.", ("version",))
        info.add_metric([__version__], 1.0)
        yield info
        yield from self._engine()
        yield from self._prediction()
        yield from self._gpus()
        yield from self._diagnoses()


def register_monitor_metrics(
    registry: CollectorRegistry, monitor: Monitor, clock: Callable[[], float]
) -> None:
    """Register the monitor's collector on ``registry``."""
    registry.register(MonitorCollector(monitor, clock))


LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
)
"""Latency buckets of the proxy's histograms, in seconds."""


class ConnectionMetrics:
    """Connections closed by the sidecar itself, per listening port."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.header_timeouts = Counter(
            "kv_sidecar_header_timeouts",
            "Connections closed (408) because a request head did not arrive within --header-timeout.",
            ["port"],
            registry=registry,
        )
        for port in ("proxy", "admin"):
            self.header_timeouts.labels(port=port)


class ProxyMetrics:
    """Latency histograms of proxied requests, on an explicit registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.duration = Histogram(
            "kv_sidecar_request_duration_seconds",
            "Time from receiving a request to the end of its response, by lane (other: not generation).",
            ["lane"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttfb = Histogram(
            "kv_sidecar_time_to_first_byte_seconds",
            "Time from receiving a request to the first byte of the upstream's response body, by lane.",
            ["lane"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        for lane in (*[lane.value for lane in Lane], "other"):
            self.duration.labels(lane=lane)
            self.ttfb.labels(lane=lane)
