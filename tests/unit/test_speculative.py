"""Speculative decoding: the page says how many draft tokens, and the ledger lets sequences grow that fast.

A step of vLLM 0.32 with ``k`` speculative tokens may give a running sequence ``k + 1`` tokens and holds
slots for its drafts and the drafter's lookahead; planned at one token a step, the ledger took a sequence
to be up to four times less far along than it was (the real CPU server with n-gram drafting, k = 3, ran
300 tokens of one greedy answer in 80 steps).
"""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from sidecar.admission.capacity import CapacityLedger, Demand
from sidecar.admission.geometry import PoolView
from sidecar.admission.planner import CapacityPlanner
from sidecar.admission.rates import Steps
from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.pool import admission_pool
from sidecar.server.admin import layout_document
from sidecar.signals import parse_vllm_metrics
from sidecar.signals.vllm import LIGHT, light_query, merge_light
from tests.fake_vllm import AFTER_LOAD_PAGE, GPU_PAGE, PRESSURE_PAGE, V0_PAGE, page
from tests.unit.test_backfill import fresh_controller, req

SPEC_PAGE = "vllm-0.32.0-cpu-tiny-ngram-spec.prom"  # the real CPU server with n-gram drafting, k = 3


def pool(k: int) -> PoolView:
    return PoolView(blocks=15, block_size=128, speculative_tokens=k)


@pytest.mark.parametrize(
    ("name", "tokens"),
    [(SPEC_PAGE, 3), (PRESSURE_PAGE, 0), (AFTER_LOAD_PAGE, 0), (GPU_PAGE, 0), (V0_PAGE, 0)],
)
def test_the_page_says_how_many_speculative_tokens(name: str, tokens: int) -> None:
    assert parse_vllm_metrics(page(name)).speculative_tokens == tokens


def test_a_light_page_keeps_the_full_pages_speculative_tokens() -> None:
    """Light rounds ask for :data:`LIGHT` alone, which does not hold the per-position counter."""
    full = parse_vllm_metrics(page(SPEC_PAGE))
    light_text = "\n".join(
        line for line in page(SPEC_PAGE).splitlines() if line.split("{")[0].split(" ")[0] in LIGHT
    )
    assert "spec_decode" not in light_query()
    merged = merge_light(full, parse_vllm_metrics(light_text))
    assert merged is not None
    assert merged.speculative_tokens == 3


def test_the_engines_pool_carries_them_to_admission() -> None:
    monitor = Monitor(PlanInputs(max_model_len=1024), MonitorSettings(), make_logger(io.StringIO()))
    monitor.record_success(parse_vllm_metrics(page(SPEC_PAGE)), now=0.0)
    answer = admission_pool(monitor)
    assert answer.view is not None
    assert (answer.view.blocks, answer.view.speculative_tokens, answer.view.tokens_per_step) == (15, 3, 4)


@pytest.mark.parametrize(
    ("k", "tokens", "blocks"),
    [
        (0, 256, 2),  # no drafting: the tokens alone
        (3, 256, 3),  # 3 drafts + up to 4 lookahead slots (DFlash's k + 1; n-gram holds none): 263 slots
        (3, 249, 2),  # 256 slots
        (3, 1020, 8),  # never past max_model_len (allocate_slots caps the slots at it)
        (1, 253, 2),  # 2k + 1 = 3 slots: 256
        (1, 254, 3),
    ],
)
def test_a_running_sequence_holds_slots_for_its_drafts(k: int, tokens: int, blocks: int) -> None:
    assert pool(k).running_blocks(tokens, 1024) == blocks


@pytest.mark.parametrize(
    ("k", "high", "ahead", "blocks"),
    [
        (0, 100, 0, 2),  # 100 steps since its admission: at most 200 tokens
        (3, 100, 0, 4),  # at most 4 tokens a step: 500 tokens and 7 slots
        (3, 300, 0, 8),  # at its peak (900 tokens) whatever the steps
        (0, 300, 0, 4),  # 400 tokens
        (0, 0, 100, 2),  # 100 steps ahead (a look ahead, not progress): 200 tokens
        (3, 0, 100, 4),  # 100 + 400 + 7 slots
    ],
)
def test_a_sequence_grows_by_up_to_k_plus_one_tokens_a_step(
    k: int, high: int, ahead: int, blocks: int
) -> None:
    ledger = CapacityLedger()
    ledger.add(Demand((100,), 1, 800, 800, 1024), Steps(low=0, high=0))
    assert ledger.projected(Steps(low=0, high=high), ahead, pool(k)) == blocks


@pytest.mark.parametrize(("k", "fits"), [(0, True), (3, False)])
def test_a_request_that_fits_at_one_token_a_step_may_not_with_drafts(k: int, fits: bool) -> None:
    """Three 100 + 700 holdings 100 steps along; a 100 + 50 one must fit over its life (179 steps at most).

    At one token a step each holding has at most 379 tokens by then (3 blocks): 9 + 2 <= 15. At four a step
    each may be at its 800-token peak (7 blocks): 21 + 2 > 15.
    """
    ledger = CapacityLedger()
    for _ in range(3):
        ledger.add(Demand((100,), 1, 700, 700, 1024), Steps(low=0, high=0))
    assert ledger.fits(Demand((100,), 1, 50, 50, 1024), pool(k), Steps(low=100, high=100)) is fits


@pytest.mark.parametrize(("k", "counted", "learned"), [(0, True, 100), (3, True, None), (3, False, 100)])
def test_a_streams_counted_events_teach_nothing_when_the_engine_speculates(
    k: int, counted: bool, learned: int | None
) -> None:
    """An event holds a step's tokens: 40 events of a k = 3 stream are 40 to 160 tokens. ``usage`` counts them."""
    planner = CapacityPlanner(pool=lambda: pool(k), max_model_len=lambda: 1024)
    holding = planner.hold(req(24, 200, ignore_eos=False), (), 0.0, in_ledger=True)
    taught = planner.release(
        holding, 1, 1.0, completed=True, completion_tokens=40, key=("r", "m"), counted=counted
    )
    assert taught is (learned is not None)
    assert planner.outputs.bound("r", "m") == learned  # one sample of 40: x (1.25 + 1.25 / 1)
    assert not planner.ledger.holdings  # released all the same


@pytest.mark.parametrize(
    ("k", "counted", "ignore_eos", "stream", "usage"),
    [
        (3, True, False, 0, 0),  # events of a speculating engine: not learned, not counted
        (0, True, False, 1, 0),  # one event a token
        (3, False, False, 0, 1),  # usage
        (0, False, True, 0, 0),  # the client fixed the length: nothing learned (was counted until 2026-12-05)
    ],
)
async def test_the_sample_metric_counts_what_was_learned(
    k: int, counted: bool, ignore_eos: bool, stream: int, usage: int
) -> None:
    registry = CollectorRegistry()
    controller = fresh_controller(pool(k), registry)
    facts = replace(req(24, 200, ignore_eos=ignore_eos), tenant="t", wait_limit=5.0)
    ticket = await controller.admit(facts)
    ticket.completion_tokens, ticket.counted = 40, counted
    controller.release(ticket)
    name = "kv_sidecar_output_length_samples_total"
    assert registry.get_sample_value(name, {"source": "stream"}) == stream
    assert registry.get_sample_value(name, {"source": "usage"}) == usage


def test_status_shows_the_speculative_tokens_admission_plans_with() -> None:
    assert layout_document(pool(3)) == {
        "full_attention_groups": 1,
        "sliding_window_groups": 0,
        "sliding_window_cap_blocks": 0,
        "speculative_tokens": 3,
    }
