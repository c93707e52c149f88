"""The admin server: ``/metrics``, ``/healthz``, ``/readyz``, ``/budget``, ``/status``.

With ``--admin-token`` every endpoint but the probes (``/healthz``, ``/readyz``) needs
``Authorization: Bearer <token>`` (compared in constant time); give the token through the
``KV_SIDECAR_ADMIN_TOKEN`` environment variable rather than the command line, where ``ps`` shows it.

It runs on its own port, apart from client traffic. ``/readyz`` answers 200 while the sidecar can
serve: not draining, the engine reachable (or the stale policy is ``open``, so the sidecar passes
traffic through even when it cannot see the engine), and the upstream's ``/metrics`` a vLLM page
(503 ``upstream-not-an-engine`` otherwise: ``--upstream`` points at another service). Handlers only read
the monitor.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sidecar import __version__
from sidecar.admission.controller import AdmissionController
from sidecar.admission.geometry import PoolView
from sidecar.admission.pressure import StaleMode
from sidecar.monitor.documents import budget_document, finite
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.pool import admission_pool
from sidecar.server.lifecycle import Lifecycle

PROBE_PATHS = frozenset({"/healthz", "/readyz"})
"""Admin paths that stay open with ``--admin-token``: kubelet probes send no credentials."""


def fallback_reason(monitor: Monitor) -> str:
    """Why capacity admission has no pool to plan against (what ``/status`` says of the fallback)."""
    return admission_pool(monitor).why  # empty while a pool is known (then capacity is not falling back)


def layout_document(pool: PoolView | None) -> dict[str, Any] | None:
    """The KV cache groups a request's blocks are planned over (``None`` while no pool is known)."""
    if pool is None:
        return None
    layout = pool.layout
    return {
        "full_attention_groups": layout.full,
        "sliding_window_groups": layout.sliding,
        "sliding_window_cap_blocks": layout.window_cap,
        "speculative_tokens": pool.speculative_tokens,  # drafts a step: sequences grow up to one more a step
        **({"state_groups": layout.state, "state_blocks": layout.state_blocks} if layout.state else {}),
        **({"windowed_groups": [asdict(w) for w in layout.windows]} if layout.windows else {}),
    }


def admission_document(controller: AdmissionController, fallback: str | None = None) -> dict[str, Any]:
    """The admission part of ``GET /status``: pressure, queues, in-flight requests."""
    detector = controller.detector
    now = controller.now()
    policy = controller.policy()
    return {
        "policy": {
            "requested": controller.config.mode.value,
            "effective": policy.value,
            "fallback": None if policy is controller.config.mode else (fallback or "no KV pool known yet"),
        },
        "pressure": {
            "state": detector.state.value,
            "effective": controller.pressure_state(now).value,
            "stale": controller.is_stale(now),
            "kv_cache_usage_ratio": detector.last_usage,
            "transitions": detector.transitions,
            "concurrency_cap": controller.concurrency_cap,
        },
        "kv_blocks": controller.planner.block_figures(now),
        "kv_layout": layout_document(controller.planner.pool()),
        "output_bounds": controller.planner.outputs.bounds(),
        "media_token_bounds": controller.planner.media.lengths.bounds(),  # prompt tokens per media item
        "prompt_count_checks": {  # exact counts against vLLM's usage and /tokenize (count_audit.py)
            "counting": controller.audit.counting,  # tokenizer or estimate, what is exact, vLLM's mode
            **controller.audit.checks,
            "recounts": controller.audit.recounts,  # too-long prompts counted by vLLM first (recount.py)
            "distrusted": [
                {"route": route, "model": model, "counted": counted, "vllm": reported}
                for (route, model), (counted, reported) in controller.audit.distrusted.items()
            ],
        },
        "queue_depth": {lane.value: len(queue) for lane, queue in controller.queues.items()},
        "queued_tokens": {lane.value: queue.tokens for lane, queue in controller.queues.items()},
        "inflight": {lane.value: count for lane, count in controller.inflight.items()},
        "reserved_kv_tokens": controller.reserved_tokens,
    }


def status_document(
    monitor: Monitor, lifecycle: Lifecycle, now: float, controller: AdmissionController | None = None
) -> dict[str, Any]:
    """``GET /status``: engine state, admission state, GPU state and lifecycle."""
    engine = monitor.engine
    snapshot = engine.snapshot
    return {
        "admission": admission_document(controller, fallback_reason(monitor)) if controller else None,
        "version": __version__,
        "draining": lifecycle.draining,
        "engine": {
            "up": bool(engine.up),
            "metrics_age_seconds": finite(engine.metrics_age(now)),
            "last_error": engine.last_error,
            "consecutive_failures": engine.consecutive_failures,
            "next_scrape_after_seconds": engine.scrape_delay,
            "kind": snapshot.kind.value if snapshot else None,
            "kv_cache_usage_ratio": snapshot.kv_usage if snapshot else None,
            "running": snapshot.running if snapshot else None,
            "waiting": snapshot.waiting if snapshot else None,
            "preemptions_total": snapshot.preemptions_total if snapshot else None,
            "engines": sorted(snapshot.engines) if snapshot else [],
        },
        "gpu": {
            "nvml": "available"
            if monitor.gpu.available
            else ("disabled" if not monitor.gpu.enabled else "unavailable"),
            "reason": monitor.gpu.unavailable_reason,
            "gpus": [
                {"index": g.index, "name": g.name, "total_bytes": g.total_bytes, "used_bytes": g.used_bytes}
                for g in monitor.gpu.gpus
            ],
        },
        "diagnoses": [d.to_dict() for d in monitor.diagnoses],
    }


def build_admin_app(  # noqa: PLR0917 - the app's collaborators, each passed explicitly
    monitor: Monitor,
    registry: CollectorRegistry,
    lifecycle: Lifecycle,
    clock: Callable[[], float],
    controller: AdmissionController | None = None,
    token: str | None = None,
) -> web.Application:
    """The aiohttp application serving the admin endpoints (``token``: bearer token but for the probes)."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if lifecycle.draining:
            return web.json_response({"ready": False, "reason": "draining"}, status=503)
        engine = monitor.engine
        stale = lifecycle.staleness.is_stale(engine.up, engine.metrics_age(clock()))
        if stale and lifecycle.staleness.policy is StaleMode.CLOSED:
            return web.json_response({"ready": False, "reason": "engine-unavailable"}, status=503)
        if engine.up and engine.snapshot is not None and not engine.snapshot.engines:
            # it answers /metrics, but with no family of any engine: --upstream points at something else
            return web.json_response({"ready": False, "reason": "upstream-not-an-engine"}, status=503)
        return web.json_response({"ready": True, "engine_up": bool(monitor.engine.up)})

    async def budget(_: web.Request) -> web.Response:
        return web.json_response(budget_document(monitor))

    async def status(_: web.Request) -> web.Response:
        return web.json_response(status_document(monitor, lifecycle, clock(), controller))

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token is None or request.path in PROBE_PATHS:
            return await handler(request)
        supplied = request.headers.get("Authorization", "")
        if hmac.compare_digest(supplied.encode(), f"Bearer {token}".encode()):
            return await handler(request)
        return web.json_response(
            {"error": "a bearer token is required (--admin-token)"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="kv-sidecar"'},
        )

    app = web.Application(middlewares=[require_token])
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/budget", budget)
    app.router.add_get("/status", status)
    return app
