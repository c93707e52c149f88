"""Every Prometheus family of the sidecar, defined here and nowhere else (README: "Metrics").

The pure layers report through protocols (admission's ``AdmissionRecorder``, the scraper's
``ScrapeRecorder``) that the classes here implement, so they import no metrics library. State that
lives elsewhere (monitor, admission queues, gateway load) is read by custom collectors at scrape
time, as ``prometheus_client`` recommends. Everything is on an explicit ``CollectorRegistry``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar import __version__
from sidecar.admission.decide import AdmissionMode
from sidecar.admission.outcomes import Lane, Outcome, Reason
from sidecar.admission.pressure import PressureState
from sidecar.monitor.diagnose import DiagnosisId, Severity
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.scraper import Page
from sidecar.server.children import Children

if TYPE_CHECKING:
    from sidecar.admission.controller import AdmissionController
    from sidecar.server.gateway import GatewayLoad

_DIAGNOSIS_IDS = tuple(DiagnosisId)  # every id is exported, 0 while inactive


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"kv_sidecar_{name}", doc, labels=list(labels))


def _counter(registry: CollectorRegistry, name: str, doc: str, *labels: str) -> Counter:
    return Counter(name, doc, list(labels), registry=registry)


def _histogram(
    registry: CollectorRegistry, name: str, doc: str, buckets: tuple[float, ...], *labels: str
) -> Histogram:
    return Histogram(name, doc, list(labels), buckets=buckets, registry=registry)


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
        age = _gauge("engine_metrics_age_seconds", "Seconds since the engine's metrics were last read.")
        value = engine.metrics_age(self._clock())
        age.add_metric([], math.inf if value is None else value)
        yield age
        usage = _gauge("engine_kv_cache_usage_ratio", "Engine KV-cache usage (0..1), the fullest engine's.")
        requests = _gauge(
            "engine_requests", "Engine requests by state: running, waiting, swapped.", ("state",)
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
        family = _gauge("diagnosis_active", "1 while the diagnosis with this id holds, else 0.", ("id",))
        for diagnosis_id in _DIAGNOSIS_IDS:
            family.add_metric([diagnosis_id.value], 1.0 if diagnosis_id in active else 0.0)
        yield family
        counts = _gauge("diagnoses", "Diagnoses holding now, by severity.", ("severity",))
        severities = [d.severity for d in self._monitor.diagnoses]
        for severity in Severity:
            counts.add_metric([severity.value], float(severities.count(severity)))
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


_SUB_SECOND = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
LATENCY_BUCKETS = (*_SUB_SECOND, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Latency buckets of the proxy's histograms, in seconds."""


class ConnectionMetrics:
    """Connections closed by the sidecar itself, per listening port."""

    def __init__(self, registry: CollectorRegistry) -> None:
        doc = "Connections closed (408): a head took over --header-timeout."
        self.header_timeouts = _counter(registry, "kv_sidecar_header_timeouts", doc, "port")
        for port in ("proxy", "admin"):
            self.header_timeouts.labels(port=port)


class ProxyMetrics:
    """Latency histograms of proxied requests, on an explicit registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.duration = _histogram(
            registry,
            "kv_sidecar_request_duration_seconds",
            "Time from receiving a request to the end of its response, by lane (other: not generation).",
            LATENCY_BUCKETS,
            "lane",
        )
        self.ttfb = _histogram(
            registry,
            "kv_sidecar_time_to_first_byte_seconds",
            "Time from receiving a request to the first byte of the upstream's response body, by lane.",
            LATENCY_BUCKETS,
            "lane",
        )
        self.duration_of, self.ttfb_of = Children(self.duration), Children(self.ttfb)  # by lane, the hot path
        for lane in (*[lane.value for lane in Lane], "other"):
            self.duration_of(lane), self.ttfb_of(lane)


WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)


class AdmissionMetrics:
    """Admission's counters and histograms, on an explicit registry: its :class:`AdmissionRecorder`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.outcomes = _counter(
            registry,
            "kv_sidecar_admission",
            "Generation requests by outcome (admitted, refused, dropped, cancelled), reason and lane.",
            "outcome",
            "reason",
            "lane",
        )
        self.queue_wait_seconds = _histogram(
            registry,
            "kv_sidecar_queue_wait_seconds",
            "Time generation requests spent in the admission queue, however they left it.",
            WAIT_BUCKETS,
            "lane",
        )
        doc = "Pressure state changes, by the state entered."
        self.transitions = _counter(registry, "kv_sidecar_pressure_transitions", doc, "to")
        self.output_samples = _counter(
            registry,
            "kv_sidecar_output_length_samples",
            "Answers whose length was learned, by source: usage, stream.",
            "source",
        )
        self._outcome, self._output_sample = Children(self.outcomes), Children(self.output_samples)
        for source in ("usage", "stream"):
            self._output_sample(source)
        for lane in Lane:
            self.queue_wait_seconds.labels(lane=lane.value)
            self._outcome(Outcome.ADMITTED.value, Reason.ADMITTED.value, lane.value)
        for state in PressureState:
            self.transitions.labels(to=state.value)

    def outcome(self, outcome: Outcome, reason: Reason, lane: Lane) -> None:
        """Count a request's end."""
        self._outcome(outcome, reason, lane).inc()  # StrEnum members are their values (and hash alike)

    def queue_wait(self, lane: Lane, seconds: float) -> None:
        """Observe a queue wait."""
        self.queue_wait_seconds.labels(lane=lane.value).observe(seconds)

    def transition(self, state: PressureState) -> None:
        """Count a pressure transition."""
        self.transitions.labels(to=state.value).inc()

    def output_sample(self, source: str) -> None:
        """Count a learned answer length."""
        self._output_sample(source).inc()


class AdmissionCollector(Collector):
    """Queue depth, in-flight requests, reserved tokens and the pressure state, read at scrape time."""

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller

    def collect(self) -> list[Metric]:
        """The gauges."""
        controller = self._controller
        depth = _gauge("queue_depth", "Requests waiting in the admission queue.", ("lane",))
        inflight = _gauge(
            "inflight_requests", "Admitted generation requests whose responses have not ended.", ("lane",)
        )
        for lane in Lane:
            depth.add_metric([lane.value], float(len(controller.queues[lane])))
            inflight.add_metric([lane.value], float(controller.inflight[lane]))
        state = _gauge(
            "pressure_state", "1 while admission acts under KV pressure (effective state), else 0."
        )
        now = controller.now()
        state.add_metric([], 1.0 if controller.pressure_state(now) is PressureState.PRESSURE else 0.0)
        reserved = _gauge(
            "reserved_kv_tokens", "KV tokens reserved by in-flight requests (token-budget accounting)."
        )
        reserved.add_metric([], float(controller.reserved_tokens))
        policy = _gauge(
            "admission_policy",
            "1 for the admission policy in effect (capacity falls back to lanes while no KV pool is known).",
            ("policy", "requested"),
        )
        effective = controller.policy()
        for mode in AdmissionMode:
            policy.add_metric([mode.value, controller.config.mode.value], 1.0 if mode is effective else 0.0)
        blocks = _gauge(
            "kv_blocks",
            "Capacity admission's view of the KV pool in blocks: pool, planned (in-flight peaks), "
            "unexplained (in use by the engine beyond the plan).",
            ("kind",),
        )
        for kind, value in controller.planner.block_figures(now).items():
            blocks.add_metric([kind], float(value))
        cap = _gauge(
            "concurrency_cap",
            "Admitted requests allowed at once while under sustained KV pressure (+Inf: no cap).",
        )
        cap.add_metric([], float(controller.concurrency_cap) if controller.concurrency_cap else math.inf)
        audit = controller.audit
        checks = _by_result("prompt_count_checks", "Exact counts checked against vLLM's own.", audit.checks)
        recounts = _by_result("prompt_recounts", "Too-long prompts counted again by vLLM.", audit.recounts)
        return [depth, inflight, state, reserved, policy, blocks, cap, checks, recounts]


def _by_result(name: str, documentation: str, counts: dict[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(f"kv_sidecar_{name}", documentation, labels=["result"])
    for result, value in counts.items():
        family.add_metric([result], float(value))
    return family


SCRAPE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
SCRAPE_ERRORS = ("connect", "timeout", "status", "parse", "too_large")


class ScrapeMetrics:
    """The scraper's own families, on an explicit registry: its ``ScrapeRecorder``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        duration = _histogram(
            registry,
            "kv_sidecar_scrape_duration_seconds",
            "Time to fetch and scan the engine's page; page = full, or light (only what admission reads).",
            SCRAPE_BUCKETS,
            "page",
        )
        self._durations = {page: duration.labels(page=page.value) for page in Page}
        self._errors = _counter(
            registry,
            "kv_sidecar_scrape_errors",
            f"Failed scrapes of the engine's /metrics by reason: {', '.join(SCRAPE_ERRORS)}.",
            "reason",
        )
        self._by_reason = {reason: self._errors.labels(reason=reason) for reason in SCRAPE_ERRORS}
        doc = "Times the scrape loop died of a bug and was started again."
        self._restarts = _counter(registry, "kv_sidecar_scraper_restarts", doc)

    def duration(self, seconds: float, page: Page) -> None:
        """Observe a round's duration."""
        self._durations[page].observe(seconds)

    def error(self, reason: str) -> None:
        """Count a failed round."""
        self._by_reason[reason].inc()

    def restart(self) -> None:
        """Count a restart of the loop."""
        self._restarts.inc()


GATEWAY_QUEUED = "kv_sidecar_gateway_queued_requests"
GATEWAY_RUNNING = "kv_sidecar_gateway_running_requests"
GATEWAY_KV_USAGE = "kv_sidecar_gateway_kv_cache_usage"


class GatewayCollector(Collector):
    """The three gateway gauges, computed at collection time."""

    def __init__(self, load: Callable[[], GatewayLoad]) -> None:
        self._load = load

    def collect(self) -> list[Metric]:
        """The gauges."""
        load = self._load()
        queued = GaugeMetricFamily(
            GATEWAY_QUEUED, "Requests waiting: the engine's waiting queue plus the sidecar's admission queue."
        )
        queued.add_metric([], load.queued)
        running = GaugeMetricFamily(
            GATEWAY_RUNNING, "Requests running in the engine (the sidecar's in-flight if unknown)."
        )
        running.add_metric([], load.running)
        usage = GaugeMetricFamily(
            GATEWAY_KV_USAGE,
            "KV-cache utilisation (0..1) as the sidecar sees it: the larger of the engine's gauge "
            "and the pool share reserved for admitted requests.",
        )
        usage.add_metric([], load.kv_usage)
        return [queued, running, usage]
