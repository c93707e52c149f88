"""A long request leaves one short request's blocks free while short requests keep coming."""

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
