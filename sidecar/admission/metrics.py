"""Admission's Prometheus families: outcomes, queue waits, transitions, and gauges read at scrape time."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.admission.decide import AdmissionMode
from sidecar.admission.outcomes import Lane, Outcome, Reason
from sidecar.admission.pressure import PressureState

if TYPE_CHECKING:
    from sidecar.admission.controller import AdmissionController

WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)


class AdmissionMetrics:
    """Counters and histograms of admission, on an explicit registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.outcomes = Counter(
            "kv_sidecar_admission",
            "Generation requests by outcome (admitted, refused, dropped, cancelled), reason and lane.",
            ["outcome", "reason", "lane"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "kv_sidecar_queue_wait_seconds",
            "Time generation requests spent in the admission queue, however they left it.",
            ["lane"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.transitions = Counter(
            "kv_sidecar_pressure_transitions",
            "Pressure state changes, by the state entered.",
            ["to"],
            registry=registry,
        )
        self.output_samples = Counter(
            "kv_sidecar_output_length_samples",
            "Completed answers whose length was learned, by how it was read (usage, stream).",
            ["source"],
            registry=registry,
        )
        for source in ("usage", "stream"):
            self.output_samples.labels(source=source)
        for lane in Lane:
            self.queue_wait.labels(lane=lane.value)
            self.outcomes.labels(
                outcome=Outcome.ADMITTED.value, reason=Reason.ADMITTED.value, lane=lane.value
            )
        for state in PressureState:
            self.transitions.labels(to=state.value)


class AdmissionCollector(Collector):
    """Queue depth, in-flight requests, reserved tokens and the pressure state, read at scrape time."""

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller

    def collect(self) -> list[Metric]:
        """The gauges."""
        controller = self._controller
        depth = GaugeMetricFamily(
            "kv_sidecar_queue_depth", "Requests waiting in the admission queue.", labels=["lane"]
        )
        inflight = GaugeMetricFamily(
            "kv_sidecar_inflight_requests",
            "Admitted generation requests whose responses have not ended.",
            labels=["lane"],
        )
        for lane in Lane:
            depth.add_metric([lane.value], float(len(controller.queues[lane])))
            inflight.add_metric([lane.value], float(controller.inflight[lane]))
        state = GaugeMetricFamily(
            "kv_sidecar_pressure_state", "1 while admission acts under KV pressure (effective state), else 0."
        )
        now = controller.now()
        state.add_metric([], 1.0 if controller.pressure_state(now) is PressureState.PRESSURE else 0.0)
        reserved = GaugeMetricFamily(
            "kv_sidecar_reserved_kv_tokens",
            "KV tokens reserved by in-flight requests (token-budget accounting).",
        )
        reserved.add_metric([], float(controller.reserved_tokens))
        policy = GaugeMetricFamily(
            "kv_sidecar_admission_policy",
            "1 for the admission policy in effect (capacity falls back to lanes while no KV pool is known).",
            labels=["policy", "requested"],
        )
        effective = controller.policy()
        for mode in AdmissionMode:
            policy.add_metric([mode.value, controller.config.mode.value], 1.0 if mode is effective else 0.0)
        blocks = GaugeMetricFamily(
            "kv_sidecar_kv_blocks",
            "Capacity admission's view of the KV pool in blocks: pool, planned (in-flight peaks), "
            "unexplained (in use by the engine beyond the plan).",
            labels=["kind"],
        )
        for kind, value in controller.planner.block_figures(now).items():
            blocks.add_metric([kind], float(value))
        cap = GaugeMetricFamily(
            "kv_sidecar_concurrency_cap",
            "Admitted requests allowed at once while under sustained KV pressure (+Inf: no cap).",
        )
        cap.add_metric([], float(controller.concurrency_cap) if controller.concurrency_cap else math.inf)
        return [depth, inflight, state, reserved, policy, blocks, cap]
