"""Backfilling: a smaller request goes ahead of a head that waits for blocks only when it cannot delay it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from sidecar.admission.body import RequestFacts
from sidecar.admission.controller import AdmissionController, QueueSettings, Ticket
from sidecar.admission.decide import AdmissionConfig
from sidecar.admission.geometry import PoolView
from sidecar.admission.planner import CapacityPlanner
from sidecar.admission.pressure import PressureDetector, PressureSettings
from sidecar.server.metrics import AdmissionMetrics

POOL = PoolView(blocks=15, block_size=128)  # vLLM's 16 blocks less the null block


def req(prompt: int, output: int, *, ignore_eos: bool = True) -> RequestFacts:
    return RequestFacts(
        prompts=(prompt,),
        max_output_tokens=output,
        exact=True,
        ignore_eos=ignore_eos,
        route="/v1/completions",
    )


def fresh_controller(
    pool: PoolView, registry: CollectorRegistry | None = None, clock: Callable[[], float] = lambda: 100.0
) -> AdmissionController:
    """A ``capacity`` controller over ``pool`` whose engine page is fresh, ``max_model_len`` 1024."""
    return AdmissionController(
        AdmissionConfig(),
        PressureDetector(PressureSettings(window=1.0)),
        QueueSettings(),
        AdmissionMetrics(registry or CollectorRegistry()),
        clock=clock,
        max_model_len=lambda: 1024,
        pool=lambda: pool,
        metrics_age=lambda _now: 0.0,
    )


MID = req(300, 200)  # 3 blocks at its start, 4 at its peak (the sustained overload's mid-size request)
SHORT = req(24, 16)  # 1 block, done within 25 steps


def three_mids_running(planner: CapacityPlanner) -> None:
    """Three mids in flight (12 blocks at their peaks), shown running by a scrape at step 1,000."""
    for at in (0.0, 0.01, 0.02):
        planner.hold(MID, (), at, in_ledger=True)
    planner.observe(0.4, 0.6, stale=False, steps=1000, waiting=0, running=3, sampled_at=0.4)


@pytest.mark.parametrize(
    ("candidate", "allowed"),
    [
        (SHORT, True),  # done long before a mid ends: the head starts when it would have
        (
            req(200, 150),
            False,
        ),  # 3 blocks over 159 steps: still there when the head would fit, and 12+3+3 > 15
        (req(24, 16, ignore_eos=False), True),  # nothing learned: planned at max_tokens, its certain end
        (req(24, 900, ignore_eos=False), False),  # planned at the learned 10 tokens: its end is not certain
    ],
)
def test_only_a_request_that_cannot_delay_the_head_may_go_ahead(
    candidate: RequestFacts, allowed: bool
) -> None:
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    three_mids_running(planner)
    if candidate.max_output_tokens == 900:
        planner.outputs.record(candidate.route, candidate.model, 4)  # answers of 4 tokens: 10 expected
    head = (MID, (), False)
    assert not planner.fits(MID, (), 0.45)  # 12 + 4 > 15: it waits for a mid to be far enough along
    assert planner.fits(candidate, (), 0.45)  # every candidate fits by itself
    assert planner.backfill_allowed(head, (candidate, ()), 0.45) is allowed
    assert len(planner.ledger.holdings) == 3  # the trial left no trace
    assert not planner.ledger.ended


def test_nothing_goes_ahead_of_a_head_whose_start_nobody_can_bound() -> None:
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    for at in (0.0, 0.01, 0.02):
        planner.hold(MID, (), at, in_ledger=True)  # no scrape has shown them: no end is certain
    assert not planner.backfill_allowed((MID, (), False), (SHORT, ()), 0.05)


async def test_a_short_request_goes_ahead_of_an_aged_head_that_waits_for_blocks() -> None:
    """Under overload an aged mid-size head held the lane while a sequence slot stayed empty."""
    now = [0.0]
    controller = fresh_controller(POOL, clock=lambda: now[0])

    async def admit(facts: RequestFacts) -> Ticket:
        return await controller.admit(replace(facts, tenant="t", wait_limit=60.0))

    for at in (0.0, 0.01, 0.02):
        now[0] = at
        await admit(MID)
    now[0] = 0.4
    controller.observe(0.4, 0.6, stale=False, steps=1000, waiting=0, running=3, sampled_at=0.4)
    head = asyncio.ensure_future(admit(MID))
    await asyncio.sleep(0)
    assert not head.done()  # 12 + 4 > 15
    now[0] = 30.0  # it has aged: more urgent than a fresh short request (order.py)
    controller.observe(30.0, 0.6, stale=False, steps=1000, waiting=0, running=3, sampled_at=30.0)
    short = asyncio.ensure_future(admit(SHORT))
    await asyncio.sleep(0)
    assert short.done()  # backfilled: the fourth slot does not wait for a mid to end
    assert not head.done()
    bigger = asyncio.ensure_future(admit(req(200, 150)))
    await asyncio.sleep(0)
    assert not bigger.done()  # it would delay the head: it waits behind it
    for task in (head, bigger):
        task.cancel()
    await asyncio.gather(head, bigger, return_exceptions=True)
