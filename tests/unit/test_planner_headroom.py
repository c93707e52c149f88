"""The capacity planner: short-request headroom for long requests, and plans that follow what is learned."""

from __future__ import annotations

from sidecar.admission.body import RequestFacts
from sidecar.admission.capacity import PoolView
from sidecar.admission.planner import SHORT_HEADROOM_SECONDS, CapacityPlanner

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
