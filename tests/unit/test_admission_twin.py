"""The twin behind ``bench/admission_bound.py``: the sidecar's planner against the step model of vLLM."""

from __future__ import annotations

import dataclasses

import pytest

from sidecar.admission.planner import CapacityPlanner
from tests.harness.admission_bound import Arrival, Engine, arrivals_of, engine_schedule, ledger_schedule
from tests.harness.admission_shapes import SHAPES, plan
from tests.harness.admission_twin import Knowledge, twin_schedule

ENGINE = Engine(blocks=15, block_size=128, max_seqs=4)  # the suite's pool: 16 blocks, one null block
LAGGED = Knowledge()  # the measured lags
INSTANT = Knowledge(transit_steps=0, return_steps=0, scrape_steps=0)
MID_SIZE = [arrivals_of(plan(SHAPES["mid-size"], f"7-mid-size-{r}"), 0.002) for r in range(3)]


@pytest.mark.parametrize("arrivals", MID_SIZE, ids=["round1", "round2", "round3"])
@pytest.mark.parametrize("knowledge", [INSTANT, LAGGED], ids=["instant", "lagged"])
def test_the_planner_never_lets_the_engine_preempt_on_mid_size_draws(arrivals, knowledge) -> None:  # type: ignore[no-untyped-def]
    """Straight vLLM preempts on these draws; the planner, learning only from scrapes and answers, never
    lets the model's pool run out, and every request ends."""
    assert engine_schedule(arrivals, ENGINE).preemptions > 0
    outcome = twin_schedule(arrivals, ENGINE, knowledge)
    assert outcome.preemptions == 0
    assert outcome.peak_blocks <= ENGINE.blocks
    assert min(outcome.ends) >= 0  # every request ended


def test_what_the_planner_learns_late_costs_steps_beyond_the_ledger_told_the_truth() -> None:
    """The ledger told every start and progress is the floor; scrapes and transit cost steps above it."""
    told, learned = [], []
    for arrivals in MID_SIZE:
        told.append(ledger_schedule(arrivals, ENGINE, start_within=30).steps)
        learned.append(twin_schedule(arrivals, ENGINE, LAGGED).steps)
    assert sum(learned) > sum(told)


def test_an_over_admitting_planner_shows_as_preemptions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The twin's engine is vLLM's scheduler: a planner that lets everything through makes it preempt."""
    monkeypatch.setattr(CapacityPlanner, "fits", lambda *_args, **_kwargs: True)
    assert twin_schedule(MID_SIZE[0], ENGINE, LAGGED).preemptions > 0


def test_requests_that_fit_together_run_together() -> None:
    small = [Arrival(step=0, prompt=24, output=16)] * 4
    outcome = twin_schedule(small, ENGINE, INSTANT)
    assert (outcome.steps, outcome.preemptions) == (16, 0)


def test_an_answer_learned_late_holds_its_blocks_until_then() -> None:
    """Two long requests that cannot run together: the second starts only once the first's end is back."""
    first, second = Arrival(step=0, prompt=1400, output=100), Arrival(step=0, prompt=1400, output=100)
    prompt_only = Engine(blocks=15, block_size=128, max_seqs=4)  # 1,500 tokens: 12 blocks each
    soon = twin_schedule([first, second], prompt_only, dataclasses.replace(INSTANT, return_steps=0))
    late = twin_schedule([first, second], prompt_only, dataclasses.replace(INSTANT, return_steps=40))
    assert late.steps - soon.steps == 40
    assert late.preemptions == soon.preemptions == 0
