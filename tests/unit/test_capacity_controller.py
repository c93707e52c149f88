"""The controller under the capacity policy: fallback, ordering, the pressure cap, learning, Retry-After, staleness."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import pytest
from prometheus_client import CollectorRegistry

from sidecar.admission.body import RequestFacts
from sidecar.admission.controller import AdmissionController, QueueSettings, Ticket
from sidecar.admission.decide import AdmissionConfig, AdmissionMode
from sidecar.admission.geometry import PoolView
from sidecar.admission.outcomes import DroppedError, Lane, Reason, RefusedError
from sidecar.admission.outputs import OutputSettings
from sidecar.admission.pressure import PressureDetector, PressureSettings, PressureState, StaleMode, Staleness
from sidecar.server.metrics import AdmissionMetrics


@dataclass
class Clock:
    """A clock the test moves; the engine's metrics are as old as the last scrape it set."""

    now: float = 100.0
    scraped_at: float | None = 100.0

    def __call__(self) -> float:
        return self.now

    def age(self, now: float) -> float | None:
        return None if self.scraped_at is None else now - self.scraped_at


POOL = PoolView(blocks=15, block_size=128)


def make(
    clock: Clock,
    *,
    pool: PoolView | None = POOL,
    policy: StaleMode = StaleMode.OPEN,
    config: AdmissionConfig | None = None,
    **queue: float,
) -> AdmissionController:
    return AdmissionController(
        config or AdmissionConfig(),
        PressureDetector(PressureSettings(window=1.0)),
        QueueSettings(**queue),  # type: ignore[arg-type]
        AdmissionMetrics(CollectorRegistry()),
        clock=clock,
        max_model_len=lambda: 1024,
        pool=lambda: pool,
        metrics_age=clock.age,
        staleness=Staleness(after=3.0, policy=policy),
        outputs=OutputSettings(min_samples=2, trusted_samples=2),
    )


def req(prompt: int, output: int, **extra: object) -> RequestFacts:
    return RequestFacts(
        prompts=(prompt,), max_output_tokens=output, exact=True, route="/v1/completions", **extra
    )  # type: ignore[arg-type]


async def admit(controller: AdmissionController, facts: RequestFacts, wait: float = 5.0) -> Ticket:
    return await controller.admit(replace(facts, tenant=facts.tenant or "t", wait_limit=wait))


LONG = req(600, 400, ignore_eos=True)  # 8 blocks at its peak
SHORT = req(24, 16, ignore_eos=True)  # 1 block


async def test_no_pool_falls_back_to_lanes_and_says_so() -> None:
    clock = Clock()
    controller = make(clock, pool=None)
    seen: list[tuple[AdmissionMode, str]] = []
    controller._on_policy = lambda policy, why: seen.append((policy, why))  # noqa: SLF001 - the hook under test
    controller.observe(clock.now, 0.1, stale=False)
    assert controller.policy() is AdmissionMode.LANES
    assert seen == [(AdmissionMode.LANES, "no KV pool or max_model_len known yet")]
    first = await admit(controller, LONG)
    waiting = asyncio.create_task(admit(controller, LONG))
    await asyncio.sleep(0)
    assert len(controller.queues[Lane.LONG]) == 1  # the lanes policy: one long at a time
    controller.release(first)
    controller.release(await waiting)


async def test_shorts_pass_a_long_head_that_does_not_fit_until_it_has_waited() -> None:
    clock = Clock()
    controller = make(clock)
    running = await admit(controller, LONG)
    second = asyncio.create_task(admit(controller, LONG))  # 8 + 8 > 15: waits
    await asyncio.sleep(0)
    assert len(controller.queues[Lane.LONG]) == 1
    short = await asyncio.wait_for(admit(controller, SHORT), 1)  # passes the waiting long one
    controller.release(short)
    clock.now += 10.0  # the long head has now waited long_wait_priority: shorts queue behind it
    blocked = asyncio.create_task(admit(controller, SHORT))
    await asyncio.sleep(0)
    controller.dispatch()
    assert not blocked.done()
    controller.release(running)
    for ticket in await asyncio.gather(second, blocked):
        controller.release(ticket)
    assert controller.total_inflight == 0


async def test_sustained_pressure_lowers_the_concurrency_one_step_per_window() -> None:
    clock = Clock()
    controller = make(clock)
    tickets = [await admit(controller, SHORT) for _ in range(4)]
    for step in range(2):  # usage at 0.9 for the 1 s window: pressure entered
        clock.now = clock.scraped_at = 100.0 + step
        controller.observe(clock.now, 0.9, stale=False)
    assert controller.detector.state is PressureState.PRESSURE
    assert controller.concurrency_cap == 3  # one below the four running
    clock.now = clock.scraped_at = 101.5
    controller.observe(clock.now, 0.9, stale=False)
    assert controller.concurrency_cap == 3  # not a window yet
    clock.now = clock.scraped_at = 102.0
    controller.observe(clock.now, 0.9, stale=False)
    assert controller.concurrency_cap == 2  # a window later, still at or above the release threshold
    controller.release(tickets.pop())
    waiting = asyncio.create_task(admit(controller, SHORT))
    await asyncio.sleep(0)
    assert not waiting.done()  # three in flight, the cap is two
    for at in (103.0, 104.0, 105.0):  # usage falls under the release threshold for the window
        clock.now = clock.scraped_at = at
        controller.observe(at, 0.5, stale=False)
    assert controller.concurrency_cap is None
    tickets.append(await asyncio.wait_for(waiting, 1))
    for ticket in tickets:
        controller.release(ticket)


async def answer(controller: AdmissionController, facts: RequestFacts, *, tokens: int, times: int) -> None:
    """Admit ``facts`` ``times`` times, each answered with ``tokens`` tokens."""
    for _ in range(times):
        ticket = await admit(controller, facts)
        ticket.completion_tokens = tokens
        controller.release(ticket)


async def test_answers_teach_the_expected_output() -> None:
    clock = Clock()
    controller = make(clock)
    generous = req(100, 900)  # no ignore_eos: may end early
    assert controller.planner.outputs.expected(generous, 1024) == (900, 900)
    await answer(controller, generous, tokens=40, times=2)
    assert controller.planner.outputs.expected(generous, 1024) == (40, 900)
    tickets = [await admit(controller, generous) for _ in range(3)]  # 3 x ceil(140 / 128): all at once
    assert controller.total_inflight == 3
    for ticket in tickets:
        controller.release(ticket)


async def test_answers_whose_length_the_client_fixed_teach_nothing() -> None:
    clock = Clock()
    controller = make(clock)
    generous = req(100, 900)
    # ignore_eos: vLLM runs to max_tokens, whatever the model would have said
    await answer(controller, req(100, 300, ignore_eos=True), tokens=300, times=3)
    assert controller.planner.outputs.samples("/v1/completions", "") == 0
    assert controller.planner.outputs.expected(generous, 1024) == (900, 900)
    await answer(controller, generous, tokens=40, times=2)
    assert controller.planner.outputs.expected(generous, 1024) == (40, 900)


async def test_retry_after_follows_the_observed_block_release_rate() -> None:
    """A known service rate: 8 blocks released every 2 s (4 blocks/s). A refused request needing 8 blocks
    behind 2 x 8 queued, with the pool full, should come back in (16 + 8) / 4 = 6 s (stated tolerance: 15%)."""
    clock = Clock()
    controller = make(clock, max_entries=2)
    running = await admit(controller, LONG)
    for _ in range(5):  # five long requests served one after another, 2 s each
        clock.now += 2.0
        controller.release(running)
        running = await admit(controller, LONG)
    queued = [asyncio.create_task(admit(controller, LONG, wait=60)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(RefusedError) as info:
        await admit(controller, LONG)
    assert info.value.reason is Reason.QUEUE_FULL
    # free now: 15 - 8 = 7; missing: 16 ahead + 8 own - 7 = 17 blocks at 4 blocks/s = 4.25 s -> 5 (whole seconds)
    assert info.value.retry_after is not None
    assert abs(info.value.retry_after - 17 / 4) <= 0.15 * 17 / 4 + 1  # + the rounding up to whole seconds
    controller.start_drain()
    for task in queued:
        with pytest.raises(Exception):  # noqa: B017, PT011 - draining drops them
            await task
    controller.release(running)


async def test_staleness_is_judged_by_the_clock_at_decision_time() -> None:
    for policy, expected in (
        (StaleMode.OPEN, PressureState.NORMAL),
        (StaleMode.CLOSED, PressureState.PRESSURE),
    ):
        clock = Clock()
        controller = make(clock, policy=policy, config=AdmissionConfig(on_pressure="reject"))
        for step in range(3):
            clock.now = clock.scraped_at = 100.0 + step
            controller.observe(clock.now, 0.95, stale=False)
        assert controller.pressure_state(clock.now) is PressureState.PRESSURE
        clock.now += 3.5  # no scrape has ended since (a hung scrape): the metrics are now 3.5 s old
        assert controller.is_stale(clock.now)
        assert controller.pressure_state(clock.now) is expected


@pytest.mark.parametrize("max_num_seqs", [1, 2, 4])
async def test_the_engine_sequence_limit_plus_one_staged_request_is_forwarded(max_num_seqs: int) -> None:
    """vLLM runs ``max_num_seqs``; one more waits in its queue, so a freed slot refills at the next step."""
    clock = Clock()
    controller = make(clock)
    controller.planner._max_num_seqs = lambda: max_num_seqs  # noqa: SLF001 - the flag's value
    tickets = [await asyncio.wait_for(admit(controller, SHORT), 1) for _ in range(max_num_seqs + 1)]
    held_back = asyncio.create_task(admit(controller, SHORT))  # it fits, but vLLM would only queue it
    await asyncio.sleep(0)
    assert not held_back.done()
    assert len(controller.queues[Lane.SHORT]) == 1
    controller.release(tickets.pop())
    tickets.append(await asyncio.wait_for(held_back, 1))
    for ticket in tickets:
        controller.release(ticket)
    assert controller.total_inflight == 0


async def test_a_waiting_request_asks_for_the_scrape_that_would_let_it_in() -> None:
    """The second long request fits once the first is 109 steps along: a scrape is asked for then, not later."""
    clock = Clock()
    controller = make(clock)
    asked: list[float] = []
    controller._scrape_soon = asked.append  # noqa: SLF001 - the hook under test (the app wires the scraper)
    controller.observe(clock.now, 0.0, stale=False, steps=1000, waiting=0, running=0)
    first = await admit(controller, LONG)
    clock.now += 0.1
    controller.observe(clock.now, 0.3, stale=False, steps=1040, waiting=0, running=1)  # 400 steps/s; shown
    second = asyncio.create_task(admit(controller, LONG))
    await asyncio.sleep(0)
    assert asked[-1] == pytest.approx(109 / 400)  # 109 steps from the scrape that showed the first running
    clock.now += 0.27
    controller.observe(clock.now, 0.4, stale=False, steps=1148, waiting=0, running=1)
    assert controller.total_inflight == 1  # 108 steps along
    controller.observe(clock.now, 0.4, stale=False, steps=1149, waiting=0, running=1)
    assert controller.total_inflight == 2
    for ticket in (first, await asyncio.wait_for(second, 1.0)):
        controller.release(ticket)


async def test_a_request_waiting_for_a_sequence_slot_asks_for_no_scrape() -> None:
    """Only a release lets it in, whatever a scrape shows; a page costs vLLM's API process ~10 ms.

    Asked after every admission anyway, scrapes came every 50 ms through the sustained overload and the
    shared-prefix spike, and vLLM's steps ran ~20% slower for it.
    """
    clock = Clock()
    controller = make(clock)
    controller.planner._max_num_seqs = lambda: 1  # noqa: SLF001 - vLLM's --max-num-seqs, as the app wires it
    asked: list[float] = []
    controller._scrape_soon = asked.append  # noqa: SLF001 - the hook under test
    controller.observe(clock.now, 0.0, stale=False, steps=1000, waiting=0, running=0)
    held = [await admit(controller, LONG), await admit(controller, SHORT)]  # one running, one staged
    third = asyncio.create_task(admit(controller, LONG))  # no slot, and 8 + 1 + 8 blocks > 15
    await asyncio.sleep(0)
    assert controller.total_inflight == 2
    assert asked == []
    controller.release(held[1])  # a slot, but still no blocks: now a scrape helps (the first's start)
    assert asked
    controller.release(held[0])
    controller.release(await asyncio.wait_for(third, 1.0))


async def test_a_dropped_request_is_told_the_wait_behind_what_will_go_before_it() -> None:
    """Under overload a mid-size request sits at the head of the arrival order while shorter ones overtake it.

    Its queue-timeout Retry-After counted only the requests ahead in arrival order (none): 1 s, where its retry
    then waited 18-28 s. Returning as a fresh request of its size, it goes behind every short one waiting.
    """
    clock = Clock()
    controller = make(clock)
    controller.planner._max_num_seqs = lambda: 1  # noqa: SLF001 - two in flight at most, one of them staged
    for _ in range(5):  # requests end at 2 a second: 2 blocks/s released, 2 requests/s
        ticket = await admit(controller, SHORT)
        clock.now += 0.5
        controller.release(ticket)
    held = [await admit(controller, LONG), await admit(controller, SHORT)]  # the engine's slots are taken
    mid = asyncio.create_task(admit(controller, req(300, 200, ignore_eos=True), wait=0.05))
    await asyncio.sleep(0)
    shorts = [asyncio.create_task(admit(controller, SHORT, wait=60)) for _ in range(10)]
    with pytest.raises(DroppedError) as info:
        await mid
    assert info.value.reason is Reason.QUEUE_TIMEOUT
    # ten short requests go first: 10 requests at 2/s = 5 s (their blocks: 10 + 4 own - 6 free at 2/s = 4 s)
    assert info.value.retry_after == 5
    controller.start_drain()
    for task in shorts:
        with pytest.raises(DroppedError):
            await task
    for ticket in held:
        controller.release(ticket)


async def test_a_streamed_answer_lets_the_next_request_in_without_a_scrape() -> None:
    """The first long request streams: its tokens are engine steps, so the second is let in at its step."""
    clock = Clock()
    controller = make(clock)
    controller._scrape_soon = lambda _delay: None  # noqa: SLF001 - no scraper here: no scrape ever comes
    controller.observe(clock.now - 0.25, 0.0, stale=False, steps=900, waiting=0, running=0)
    controller.observe(clock.now, 0.0, stale=False, steps=1000, waiting=0, running=0)  # 400 steps/s
    first = await admit(controller, LONG)
    second = asyncio.create_task(admit(controller, LONG))
    await asyncio.sleep(0)
    for tokens in range(1, 116):
        clock.now += 1 / 400
        controller.progress(first, tokens)
    assert controller.total_inflight == 1  # 115 events: one short of proving the step the second one fits at
    clock.now += 1 / 400
    controller.progress(first, 116)
    assert controller.total_inflight == 2
    for ticket in (first, await asyncio.wait_for(second, 1.0)):
        controller.release(ticket)
