"""The capacity planner: short-request headroom for long requests, and plans that follow what is learned."""

from __future__ import annotations

import pytest

from sidecar.admission.body import RequestFacts
from sidecar.admission.capacity import TRANSIT_SECONDS
from sidecar.admission.geometry import PoolView
from sidecar.admission.outcomes import Lane
from sidecar.admission.planner import (
    CLOCK_SECONDS,
    ENTRY_SECONDS,
    SHORT_HEADROOM_SECONDS,
    STAGED_SEQUENCES,
    CapacityPlanner,
)

POOL = PoolView(blocks=15, block_size=128)


def facts(prompt: int, output: int) -> RequestFacts:
    return RequestFacts(prompts=(prompt,), max_output_tokens=output, exact=True, ignore_eos=True)


def test_a_long_request_leaves_the_last_short_ones_blocks_while_shorts_keep_coming() -> None:
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    planner.hold(facts(600, 400), (), 0.0, in_ledger=True)  # 8 blocks at its peak
    candidate = facts(700, 196)  # 7 blocks at its peak: 8 + 7 fills the pool exactly
    assert planner.fits(candidate, (), 0.5, leave_short_room=True)  # no short request seen yet
    planner.saw_short(facts(24, 16), (), 1.0)  # one block
    assert not planner.fits(candidate, (), 1.5, leave_short_room=True)
    assert planner.fits(candidate, (), 1.5)  # without the rule (a short request's own check)
    later = 1.0 + SHORT_HEADROOM_SECONDS + 0.1
    assert planner.fits(candidate, (), later, leave_short_room=True)  # the shorts stopped coming


def test_a_request_asked_again_is_planned_with_what_was_learned_in_between() -> None:
    """One decision asks for a request's plan several times; an answer learned in between must change it."""
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    request = RequestFacts(prompts=(100,), max_output_tokens=900, exact=True, route="/v1/completions")
    before = planner.demand(request, ())
    assert before is not None
    assert before.expected_output == 900  # nothing learned: the client's bound
    assert planner.demand(request, ()) is before  # asked again at once: the same plan
    planner.outputs.record(request.route, request.model, 40)
    after = planner.demand(request, ())
    assert after is not None
    assert after.expected_output == 100  # 40 x 2.5 after one answer


def test_a_scrape_is_wanted_soon_after_an_admission_no_scrape_has_shown() -> None:
    """Progress counts from the first scrape that shows a request running: the sooner, the less it lags."""
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    head = (facts(600, 400), (), False)  # 5 blocks now, 8 at its peak: waits for the first to progress
    assert planner.scrape_wanted(10.0, [head]) is None  # nothing in flight: it fits
    planner.hold(facts(600, 400), (), 10.0, in_ledger=True)
    assert planner.scrape_wanted(10.0, [head]) == pytest.approx(ENTRY_SECONDS)
    assert planner.scrape_wanted(10.0 + ENTRY_SECONDS + 0.01, [head]) == 0.0  # overdue: now
    # too old to be on its way: only the unknown step clock still asks
    assert planner.scrape_wanted(10.0 + TRANSIT_SECONDS + 0.001, [head]) == pytest.approx(CLOCK_SECONDS)
    assert planner.scrape_wanted(10.0, [(facts(24, 16), (), False)]) is None  # a head that fits asks nothing
    assert planner.scrape_wanted(10.0, []) is None  # nobody waits for blocks
    planner.observe(10.05, 0.3, stale=False, steps=1000, waiting=0, running=1, sampled_at=10.05)
    # shown running, but no step rate is known yet: ask soon, to learn how fast the engine steps
    assert planner.scrape_wanted(10.06, [head]) == pytest.approx(CLOCK_SECONDS)
    planner.observe(10.1, 0.3, stale=False, steps=1000, waiting=0, running=1, sampled_at=10.1)
    assert planner.scrape_wanted(10.11, [head]) == pytest.approx(CLOCK_SECONDS)  # no step between the two
    planner.observe(10.2, 0.3, stale=False, steps=1030, waiting=0, running=1, sampled_at=10.2)
    assert planner.scrape_wanted(10.21, [head]) == pytest.approx(
        79 / 300 - 0.01
    )  # 109 - 30 steps at 300/s, from 10.2


def test_a_scrape_is_wanted_when_the_engine_will_have_run_the_steps_a_waiting_request_needs() -> None:
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    planner.hold(facts(600, 400), (), 10.0, in_ledger=True)
    planner.observe(10.05, 0.3, stale=False, steps=1000, waiting=0, running=1, sampled_at=10.05)
    planner.observe(10.30, 0.4, stale=False, steps=1100, waiting=0, running=1, sampled_at=10.30)  # 400/s
    head = (facts(600, 400), (), False)
    # the second long fits once the first is 109 steps along (test_capacity): 9 more steps, 22.5 ms at 400/s
    # after the scrape that read the count (10.30), not after now
    assert planner.scrape_wanted(10.31, [head]) == pytest.approx(9 / 400 - 0.01)
    assert planner.scrape_wanted(10.31, [(facts(24, 16), (), False)]) is None  # a short one fits already
    planner.observe(10.35, 0.4, stale=False, steps=1100, waiting=0, running=1, sampled_at=10.35)  # no step
    # still 9 steps to go, timed by the last 0.3 s (100 steps: 333/s), not by the last 50 ms (0/s: never)
    assert planner.scrape_wanted(10.36, [head]) == pytest.approx(9 / (100 / 0.3) - 0.01)


@pytest.mark.parametrize(
    ("in_flight", "waiting", "only_sequences"),
    [
        (0, {}, True),  # nobody waits: nothing for a scrape to tell
        (
            0,
            {Lane.SHORT: 1},
            False,
        ),  # nothing in flight: a waiting request has a slot, so blocks hold it back
        (4, {Lane.SHORT: 3}, False),  # 4 + 1 <= 4 + STAGED_SEQUENCES: a slot is free
        (5, {Lane.SHORT: 3}, True),  # every slot taken: only a release lets the next in
        (4, {Lane.LONG: 1, Lane.SHORT: 1}, False),  # the short one has the slot the long one must leave it
        (4, {Lane.LONG: 2}, False),  # no short waits, so the long one may take the last slot
        (5, {Lane.LONG: 1, Lane.SHORT: 0}, True),
    ],
)
def test_requests_waiting_only_for_a_sequence_slot_need_no_scrape(
    in_flight: int, waiting: dict[Lane, int], only_sequences: bool
) -> None:
    """Calm scraping (``ScrapeSettings.calm_interval``) rests on this: a slot frees when a response ends."""
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024, max_num_seqs=lambda: 4)
    for _ in range(in_flight):
        planner.hold(facts(24, 16), (), 0.0, in_ledger=True)
    assert STAGED_SEQUENCES == 1
    assert planner.waits_only_for_sequences(waiting) is only_sequences


def test_a_scrape_can_wait_only_while_the_gauge_shows_nothing_beyond_the_ledger() -> None:
    """A client bypassing the sidecar grows usage that only scrapes show: no calm interval then."""
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024, max_num_seqs=lambda: 4)
    planner.hold(facts(600, 400), (), 0.0, in_ledger=True)
    assert planner.scrape_can_wait({})
    assert not planner.scrape_can_wait({Lane.SHORT: 1})  # a queued request has a slot
    planner.ledger.unexplained = 2
    assert not planner.scrape_can_wait({})


def test_a_request_with_a_sequence_slot_of_its_own_starts_within_its_transit() -> None:
    """Its start margin is the transit at the engine's highest step rate; without a slot, nothing bounds it."""
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024, max_num_seqs=lambda: 2)
    assert planner.start_within(facts(600, 400)) is None  # no step rate known yet
    planner.observe(10.0, 0.0, stale=False, steps=1000, waiting=0, running=0, sampled_at=10.0)
    planner.observe(10.1, 0.0, stale=False, steps=1050, waiting=0, running=0, sampled_at=10.1)  # 500 steps/s
    assert planner.start_within(facts(600, 400)) == pytest.approx(TRANSIT_SECONDS * 500 * 1.1)
    planner.hold(facts(24, 16), (), 10.1, in_ledger=True)
    planner.hold(facts(24, 16), (), 10.1, in_ledger=True)
    assert planner.start_within(facts(600, 400)) is None  # it would be staged: it waits for a release
    unknown_limit = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    unknown_limit.observe(10.0, 0.0, stale=False, steps=1000, waiting=0, running=0, sampled_at=10.0)
    unknown_limit.observe(10.1, 0.0, stale=False, steps=1050, waiting=0, running=0, sampled_at=10.1)
    assert unknown_limit.start_within(facts(600, 400)) is None  # the engine's limit is not known


def test_a_stream_is_a_step_clock_between_scrapes() -> None:
    """A streamed answer tells the planner the engine's steps without a scrape, and when to look again."""
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    planner.observe(9.75, 0.0, stale=False, steps=900, waiting=0, running=0, sampled_at=9.75)
    planner.observe(10.0, 0.0, stale=False, steps=1000, waiting=0, running=0, sampled_at=10.0)  # 400/s
    first = planner.hold(facts(600, 400), (), 10.0, in_ledger=True)  # admitted after the count of 1,000
    second = facts(600, 400)  # fits once the first is ~109 steps along and certain to end (test_capacity)
    assert planner.scrape_wanted(10.0, [(second, (), False)]) is not None
    assert planner.wake_at is None  # not shown running: nothing says when it ends
    assert not planner.progress(first, 2, 10.005)  # a chat stream's role event and one more prove nothing
    assert planner.progress(first, 3, 10.0075)  # a token: it runs, its end is certain, look again
    assert planner.scrape_wanted(10.0075, [(second, (), False)]) is not None
    assert planner.wake_at == 1114  # 113 steps after the count that token proves
    assert not planner.progress(first, 3, 10.008)  # nothing new
    assert not planner.progress(first, 102, 10.255)
    assert planner.steps.bounds(10.255).low == 1100  # 1,000 + 100 proved, with no scrape since 10.0
    assert not planner.fits(second, (), 10.255)
    assert not planner.progress(first, 115, 10.2875)
    assert planner.progress(first, 116, 10.29)  # the engine reached the step the second one fits at
    assert planner.fits(second, (), 10.29)  # and it does, with no scrape since 10.0
    assert not planner.progress(first, 117, 10.2925)  # once: the dispatch sets the next wake, not each token
