"""The step-count model behind ``bench/admission_bound.py``: vLLM's scheduler and two preemption-free admissions."""

from __future__ import annotations

import pytest

from tests.harness.admission_bound import (
    Arrival,
    Engine,
    arrivals_of,
    engine_schedule,
    ledger_schedule,
    preemption_free_schedule,
)
from tests.harness.admission_shapes import SHAPES, plan

ENGINE = Engine(blocks=15, block_size=128, max_seqs=4)  # the suite's pool: 16 blocks, one null block
LONG = Arrival(step=0, prompt=600, output=400)  # 5 blocks at once, 8 before its last token


def test_straight_vllm_runs_both_long_requests_at_once_and_preempts_the_newest() -> None:
    """Both prompts fit (5 + 6 blocks), so vLLM takes both; 8 + 8 > 15 later, and it preempts the newest."""
    outcome = engine_schedule([LONG, Arrival(step=1, prompt=700, output=300)], ENGINE)
    assert outcome.preemptions == 1
    assert outcome.peak_blocks == ENGINE.blocks
    assert outcome.ends[0] == 399  # the first never stops: its 400 tokens in steps 0-399
    assert outcome.ends[1] == 403  # the second, recomputed, ends just after


def test_the_clairvoyant_admission_starts_the_second_when_both_fit_to_the_end() -> None:
    """The second starts when the first is 103 tokens along: the first's last step needs its 8 blocks
    (999 tokens) and the second's 999 - 103 = 896 tokens need 7."""
    outcome = preemption_free_schedule([LONG, LONG], ENGINE)
    assert outcome.preemptions == 0
    assert outcome.peak_blocks == ENGINE.blocks
    assert outcome.ends == (399, 103 + 400 - 1)


@pytest.mark.parametrize("schedule", [engine_schedule, preemption_free_schedule])
def test_requests_that_fit_together_run_together(schedule) -> None:  # type: ignore[no-untyped-def]
    small = [Arrival(step=0, prompt=24, output=16)] * 4
    assert schedule(small, ENGINE).steps == 16
    assert schedule(small, ENGINE).preemptions == 0


def test_the_ledger_and_the_clairvoyant_never_overfill_the_pool_on_the_suites_draws() -> None:
    """On a mid-size draw straight vLLM preempts; neither preemption-free admission ever needs more blocks."""
    drawn = plan(SHAPES["mid-size"], "7-mid-size-0")
    arrivals = arrivals_of(drawn, 0.002)
    straight = engine_schedule(arrivals, ENGINE)
    assert straight.preemptions > 0
    for outcome in (
        preemption_free_schedule(arrivals, ENGINE),
        ledger_schedule(arrivals, ENGINE, start_within=55),
    ):
        assert outcome.peak_blocks <= ENGINE.blocks
        assert outcome.steps >= straight.steps * 0.95


def test_a_larger_start_margin_never_lets_the_ledger_finish_sooner() -> None:
    """The margin only keeps requests out longer (the bench reports what the planner's margin costs)."""
    drawn = plan(SHAPES["mid-size"], "7-mid-size-2")
    arrivals = arrivals_of(drawn, 0.002)
    tight = ledger_schedule(arrivals, ENGINE, start_within=0)
    default = ledger_schedule(arrivals, ENGINE, start_within=None)  # one block's worth of steps
    assert tight.steps <= default.steps
