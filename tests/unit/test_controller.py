"""The admission controller on its event loop: grants, waiting, timeouts, cancellation, drain."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from sidecar.admission.body import RequestFacts
from sidecar.admission.controller import AdmissionController, QueueSettings
from sidecar.admission.decide import AdmissionConfig, AdmissionMode
from sidecar.admission.geometry import PoolView
from sidecar.admission.outcomes import DroppedError, Lane, Reason, RefusedError
from sidecar.admission.pressure import PressureDetector, PressureSettings
from sidecar.server.metrics import AdmissionMetrics


def make(
    config: AdmissionConfig | None = None, **queue: float
) -> tuple[AdmissionController, CollectorRegistry]:
    registry = CollectorRegistry()
    controller = AdmissionController(
        config or AdmissionConfig(mode=AdmissionMode.LANES),
        PressureDetector(PressureSettings(window=1.0)),
        QueueSettings(**queue),  # type: ignore[arg-type]
        AdmissionMetrics(registry),
        clock=asyncio.get_running_loop().time,
        max_model_len=lambda: 1024,
        pool=lambda: PoolView(blocks=100, block_size=10),  # 1,000 tokens
        metrics_age=lambda _now: 0.0,
    )
    return controller, registry


SHORT = RequestFacts(prompts=(10,), max_output_tokens=10, exact=True)
LONG = RequestFacts(prompts=(600,), max_output_tokens=10, exact=True)


def count(registry: CollectorRegistry, outcome: str, reason: str, lane: str) -> float:
    value = registry.get_sample_value(
        "kv_sidecar_admission_total", {"outcome": outcome, "reason": reason, "lane": lane}
    )
    return value or 0.0


async def admit(controller: AdmissionController, facts: RequestFacts, wait: float = 5.0):  # type: ignore[no-untyped-def]
    return await controller.admit(replace(facts, tenant=facts.tenant or "t", wait_limit=wait))


async def test_long_lane_waits_for_release() -> None:
    controller, _ = make()
    first = await admit(controller, LONG)
    second = asyncio.create_task(admit(controller, LONG))
    await asyncio.sleep(0.01)
    assert len(controller.queues[Lane.LONG]) == 1
    assert not second.done()
    controller.release(first)
    ticket = await asyncio.wait_for(second, 1)
    assert (ticket.lane, ticket.queued) == (Lane.LONG, True)
    assert controller.inflight[Lane.LONG] == 1
    controller.release(ticket)
    controller.release(ticket)  # releasing twice is harmless
    assert controller.inflight[Lane.LONG] == 0


async def test_wait_limit_drops_with_retry_after() -> None:
    controller, registry = make()
    held = await admit(controller, LONG)
    with pytest.raises(DroppedError) as info:
        await admit(controller, LONG, wait=0.05)
    assert info.value.reason is Reason.QUEUE_TIMEOUT
    assert info.value.retry_after is not None
    assert info.value.retry_after >= 1
    assert count(registry, "dropped", "queue-timeout", "long") == 1
    assert len(controller.queues[Lane.LONG]) == 0
    controller.release(held)


async def test_cancelled_waiter_leaves_the_queue_at_once() -> None:
    controller, registry = make()
    held = await admit(controller, LONG)
    waiting = asyncio.create_task(admit(controller, LONG))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(controller.queues[Lane.LONG]) == 0
    assert registry.get_sample_value("kv_sidecar_queue_wait_seconds_count", {"lane": "long"}) == 1
    assert count(registry, "cancelled", "client-disconnected", "long") == 0  # the proxy counts cancellations
    controller.release(held)
    assert controller.total_inflight == 0


async def test_drain_drops_waiters_and_refuses_newcomers() -> None:
    controller, registry = make()
    held = await admit(controller, LONG)
    waiting = asyncio.create_task(admit(controller, LONG))
    await asyncio.sleep(0.01)
    controller.start_drain()
    with pytest.raises(DroppedError) as dropped:
        await waiting
    assert dropped.value.reason is Reason.DRAINING
    with pytest.raises(RefusedError) as refused:
        await admit(controller, SHORT)
    assert refused.value.reason is Reason.DRAINING
    assert count(registry, "dropped", "draining", "long") == 1
    controller.release(held)


async def test_queue_full_is_refused() -> None:
    controller, registry = make(max_entries=1)
    held = await admit(controller, LONG)
    waiting = asyncio.create_task(admit(controller, LONG))
    await asyncio.sleep(0.01)
    with pytest.raises(RefusedError) as info:
        await admit(controller, LONG)
    assert info.value.reason is Reason.QUEUE_FULL
    assert count(registry, "refused", "queue-full", "long") == 1
    controller.release(held)
    controller.release(await waiting)


async def test_pressure_holds_long_requests_until_it_ends() -> None:
    controller, _ = make()
    now = asyncio.get_running_loop().time()
    controller.observe(now - 2, 0.95, stale=False)
    controller.observe(now, 0.95, stale=False)
    waiting = asyncio.create_task(admit(controller, LONG))
    short = await admit(controller, SHORT)
    await asyncio.sleep(0.01)
    assert not waiting.done()
    controller.observe(now + 1, 0.5, stale=False)
    controller.observe(now + 2.5, 0.5, stale=False)
    ticket = await asyncio.wait_for(waiting, 1)
    controller.release(ticket)
    controller.release(short)


async def test_token_budget_reserves_peak_tokens() -> None:
    controller, _ = make(AdmissionConfig(mode="token-budget"))
    big = RequestFacts(prompts=(400,), max_output_tokens=200, exact=True)  # 600 of the pool's 1000
    first = await admit(controller, big)
    assert controller.reserved_tokens == 600
    waiting = asyncio.create_task(admit(controller, big))
    await asyncio.sleep(0.01)
    assert len(controller.queues[Lane.SHORT]) == 1
    small = asyncio.create_task(admit(controller, SHORT))  # queues behind: no overtaking
    await asyncio.sleep(0.01)
    assert not small.done()
    controller.release(first)
    second = await asyncio.wait_for(waiting, 1)
    third = await asyncio.wait_for(small, 1)
    assert controller.reserved_tokens == 620
    controller.release(second)
    controller.release(third)
    assert controller.reserved_tokens == 0
