"""The gateway view: the pod's load as an inference gateway should see it, on the traffic port.

Theory of operation
-------------------
An inference gateway's endpoint picker (the Gateway API Inference Extension's EPP, developed in
llm-d) scrapes every model-server pod at ``podIP:targetPort/metrics`` and routes on three gauges
its *model server protocol* fixes (``docs/proposals/003-model-server-protocol`` in
kubernetes-sigs/gateway-api-inference-extension): requests queued, requests running and the
KV-cache utilisation as a fraction in [0, 1]. With the sidecar in the pod, the traffic port is
the sidecar's: passing vLLM's page through would show the gateway vLLM's (empty) waiting queue
while requests wait in the sidecar's, so the busiest pod would keep getting traffic.

So ``GET /metrics`` on the proxy port serves the engine's last scraped page (every family the
gateway may also read, ``vllm:lora_requests_info`` included) followed by three series of the
sidecar's own, named so that no one mistakes them for the engine's:

* ``kv_sidecar_gateway_queued_requests``: the engine's waiting requests (last scrape) plus the
  requests in the sidecar's admission queue (now);
* ``kv_sidecar_gateway_running_requests``: the engine's running requests, or the sidecar's
  in-flight requests while the engine's page has none;
* ``kv_sidecar_gateway_kv_cache_usage``: the larger of the engine's KV gauge and the share of the
  pool the sidecar has reserved for what it admitted (capacity admission: the in-flight
  requests' planned peaks in blocks; token-budget: reserved tokens), capped at 1.

:func:`gateway_load` is the pure rule; ``sidecar.server.metrics.GatewayCollector`` reads it at
collection time (registered on the admin registry too, for Prometheus and KEDA); :class:`GatewayPage` answers
the proxy's ``/metrics`` from memory (no upstream request, no parsing: a join of the cached page
and three rendered lines), so the answer never waits on a slow scrape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from sidecar.admission.controller import AdmissionController
from sidecar.admission.decide import AdmissionMode
from sidecar.server.metrics import GATEWAY_KV_USAGE, GATEWAY_QUEUED, GATEWAY_RUNNING
from sidecar.signals import EngineSnapshot

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The text format vLLM's page is in (``prometheus_client``'s 0.0.4), so one page holds both."""

QUEUED, RUNNING, KV_USAGE = GATEWAY_QUEUED, GATEWAY_RUNNING, GATEWAY_KV_USAGE
"""The gateway series' names (defined with every other family in :mod:`sidecar.server.metrics`)."""


@dataclass(frozen=True, slots=True)
class GatewayLoad:
    """The three figures a gateway routes on."""

    queued: float
    running: float
    kv_usage: float


def gateway_load(
    *,
    engine_waiting: float | None,
    engine_running: float | None,
    engine_kv_usage: float | None,
    sidecar_queued: int,
    sidecar_inflight: int,
    reserved_share: float | None,
) -> GatewayLoad:
    """The sidecar-adjusted load (see the module docstring); ``None`` inputs are unknown, not zero."""
    kv_values = [v for v in (engine_kv_usage, reserved_share) if v is not None and math.isfinite(v)]
    return GatewayLoad(
        queued=float(sidecar_queued) + (engine_waiting or 0.0),
        running=engine_running if engine_running is not None else float(sidecar_inflight),
        kv_usage=min(1.0, max(0.0, *kv_values)) if kv_values else 0.0,
    )


def reserved_share(controller: AdmissionController, now: float) -> float | None:
    """The share of the KV pool the sidecar has reserved for what it admitted, or ``None``."""
    policy = controller.policy()
    pool = controller.planner.pool()
    if pool is None or pool.blocks <= 0:
        return None
    if policy is AdmissionMode.CAPACITY:
        figures = controller.planner.block_figures(now)
        return figures.get("planned", 0) / pool.blocks
    if policy is AdmissionMode.TOKEN_BUDGET:
        return controller.reserved_tokens / (pool.blocks * pool.block_size)
    return None


def current_load(
    controller: AdmissionController, snapshot: Callable[[], EngineSnapshot | None]
) -> GatewayLoad:
    """The gateway load now, from the controller and the engine's last snapshot."""
    now = controller.now()
    engine = snapshot()
    return gateway_load(
        engine_waiting=engine.waiting if engine else None,
        engine_running=engine.running if engine else None,
        engine_kv_usage=engine.kv_usage if engine else None,
        sidecar_queued=sum(len(queue) for queue in controller.queues.values()),
        sidecar_inflight=controller.total_inflight,
        reserved_share=reserved_share(controller, now),
    )


class GatewayPage:
    """The proxy port's ``/metrics`` body: the engine's cached page, then the gateway gauges."""

    def __init__(self, collector: Collector, engine_page: Callable[[], bytes]) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(collector)
        self._engine_page = engine_page

    def render(self) -> bytes:
        """The page now (from memory; no I/O)."""
        page = self._engine_page()
        ours = generate_latest(self._registry)
        if page and not page.endswith(b"\n"):
            page += b"\n"
        return page + ours
