"""Learned output lengths, the step clock, the release rate and the engine-parity refusals."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.admission.body import RequestFacts, request_facts
from sidecar.admission.outcomes import Reason
from sidecar.admission.outputs import OutputLengths, OutputSettings
from sidecar.admission.parity import engine_refusal
from sidecar.admission.rates import RATE_MARGIN, ReleaseRate, StepClock, Steps
from sidecar.admission.tokens import EstimatingCounter
from sidecar.signals.vllm import parse_vllm_metrics

ROUTE = "/v1/chat/completions"


def facts(prompt: int = 100, max_tokens: int | None = None, **extra: object) -> RequestFacts:
    return RequestFacts(
        prompts=(prompt,), max_output_tokens=max_tokens, exact=True, route=ROUTE, model="m", **extra
    )  # type: ignore[arg-type]


def test_the_prior_is_the_clients_bound_or_the_room_left() -> None:
    outputs = OutputLengths()
    assert outputs.expected(facts(100, 50), 1024) == (50, 50)
    assert outputs.expected(facts(100, None), 1024) == (924, 924)  # vLLM's chat default: the room left
    assert outputs.expected(facts(1000, 100), 1024) == (24, 24)  # vLLM shortens it to the room left


def test_the_learned_bound_small_samples_then_a_nearest_rank_quantile() -> None:
    outputs = OutputLengths(OutputSettings(quantile=0.95, trusted_samples=20))
    assert outputs.bound(ROUTE, "m") is None  # no answer yet: the prior holds
    outputs.record(ROUTE, "m", 40)
    assert outputs.bound(ROUTE, "m") == 100  # one answer: 2.5 x the largest
    for length in (10, 20, 30):
        outputs.record(ROUTE, "m", length)
    assert outputs.bound(ROUTE, "m") == 63  # four: 40 x (1.25 + 1.25 / 4) = 62.5, rounded up
    for length in range(41, 57):
        outputs.record(ROUTE, "m", length)
    assert outputs.bound(ROUTE, "m") == 55  # 20 answers (40, 10..30, 41..56): the 19th, ceil(0.95 x 20)
    assert outputs.bound("/v1/completions", "m") is None  # per route
    assert outputs.bound(ROUTE, "other") is None  # and per model


def test_expected_output_uses_the_learned_bound_below_the_clients() -> None:
    outputs = OutputLengths(OutputSettings(min_samples=1, trusted_samples=1))
    outputs.record(ROUTE, "m", 60)
    assert outputs.expected(facts(100, 900), 1024) == (60, 900)
    assert outputs.expected(facts(100, 40), 1024) == (40, 40)  # the client's bound is below it
    assert outputs.expected(facts(100, 900, ignore_eos=True), 1024) == (900, 900)  # vLLM generates all of it
    assert outputs.expected(facts(100, 900, min_output_tokens=200), 1024) == (200, 900)


def test_the_window_forgets_old_answers() -> None:
    outputs = OutputLengths(OutputSettings(min_samples=1, trusted_samples=4, window=4))
    for length in (500, 10, 10, 10, 10):
        outputs.record(ROUTE, "m", length)
    assert outputs.bound(ROUTE, "m") == 10


@pytest.mark.parametrize(
    "bad", [{"quantile": 0.4}, {"quantile": 1.1}, {"min_samples": 0}, {"window": 2}, {"trusted_samples": 300}]
)
def test_output_settings_are_validated(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="output"):
        OutputSettings(**bad)  # type: ignore[arg-type]


def test_the_step_clock_never_lags_the_engine_and_never_runs_ahead_of_it() -> None:
    clock = StepClock()
    assert clock.bounds(0.0) == Steps(at=0.0)
    clock.observe(0.0, 1000)
    assert clock.bounds(0.5) == Steps(low=1000, at=0.5)  # no rate yet: the upper bound is unknown
    clock.observe(1.0, 1200)  # 200 steps/s
    clock.observe(2.0, 1300)  # 100 steps/s: the fastest rate seen still counts
    bounds = clock.bounds(2.5)
    assert bounds.low == 1300  # what the last scrape read: a step may take any time, nothing extrapolates it
    assert bounds.high == pytest.approx(1300 + 0.5 * 200 * RATE_MARGIN)
    assert bounds.top_rate == pytest.approx(200 * RATE_MARGIN)  # what the clock assumes, progress bounds too
    assert bounds.most_since(2.0) == pytest.approx(0.5 * 200 * RATE_MARGIN)
    assert bounds.later(30).most_since(2.0) == pytest.approx(0.5 * 200 * RATE_MARGIN + 30)
    clock.observe(5.0, 10)  # the counter went down: the engine restarted
    assert clock.bounds(5.5) == Steps(low=10, at=5.5)


@pytest.mark.parametrize(
    ("scrapes", "pace"),
    [
        ([], 0.0),  # nothing read yet
        ([(0.0, 1000)], 0.0),  # one scrape: no rate
        ([(0.0, 1000), (0.25, 1075), (0.5, 1150), (0.55, 1150)], 150 / 0.55),  # a 50 ms pair saw no step
        ([(0.0, 1000), (0.25, 1075), (0.5, 1150), (0.55, 1153)], 153 / 0.55),  # ...or only a few
        ([(0.0, 1000), (0.25, 1075), (0.30, 1100)], 500.0),  # the last pair faster: it counts
        ([(0.0, 0), (1.0, 300), (2.0, 900), (2.5, 1050)], 500.0),  # a window back: 1.0 -> 2.5 s
        ([(0.0, 1000), (0.5, 1150), (1.0, 10), (1.25, 85)], 300.0),  # the engine restarted: counted anew
    ],
)
def test_the_step_clock_paces_scrapes_by_a_window_not_by_the_last_pair(
    scrapes: list[tuple[float, float]], pace: float
) -> None:
    """Two scrapes 50 ms apart may see no step at all (a long prefill): the next scrape must not wait for it."""
    clock = StepClock()
    for at, steps in scrapes:
        clock.observe(at, steps)
    assert clock.pace() == pytest.approx(pace)


def test_the_release_rate_of_a_known_service_rate() -> None:
    rate = ReleaseRate()
    assert rate.per_second(0.0) is None
    for second in range(10):  # 3 blocks every second
        rate.record(float(second), 3)
    assert rate.per_second(9.0) == pytest.approx(3.0)
    assert rate.per_second(45.0) is None  # older than the window


MML = 1024


@pytest.mark.parametrize(
    ("request_", "reason", "param"),
    [
        (
            RequestFacts((5,), 5000, exact=False),
            Reason.CONTEXT_LENGTH_EXCEEDED,
            "max_tokens",
        ),  # no count needed
        (RequestFacts((5,), 1025, exact=True), Reason.CONTEXT_LENGTH_EXCEEDED, "max_tokens"),
        (RequestFacts((5,), 1024, exact=True), None, None),  # served: 1,019 tokens come back
        (RequestFacts((1000,), 100, exact=True), None, None),  # prompt + max_tokens > max_model_len: served
        (RequestFacts((1023,), 5, exact=True), None, None),
        (
            RequestFacts((1024,), 1, exact=True),
            Reason.CONTEXT_LENGTH_EXCEEDED,
            "prompt",
        ),  # no room for output
        (RequestFacts((1024,), 1, exact=False), None, None),  # an estimate never causes a 400
        (RequestFacts((10, 1025), 1, exact=True), Reason.CONTEXT_LENGTH_EXCEEDED, "prompt"),  # per prompt
        (RequestFacts((5,), None, exact=True), None, None),
    ],
)
def test_engine_parity(request_: RequestFacts, reason: Reason | None, param: str | None) -> None:
    refusal = engine_refusal(request_, MML)
    assert (refusal.reason if refusal else None, refusal.param if refusal else None) == (reason, param)
    assert engine_refusal(request_, None) is None  # nothing is refused while max_model_len is unknown


def test_the_engines_record_is_the_prior_before_answers_of_our_own() -> None:
    # vLLM's vllm:request_generation_tokens histogram: 100 finished requests, 96 of them within 200 tokens
    record = ((50.0, 60.0), (100.0, 90.0), (200.0, 96.0), (500.0, 100.0), (math.inf, 100.0))
    lengths = OutputLengths(OutputSettings(min_samples=1, trusted_samples=20))
    facts = RequestFacts(
        prompts=(100,), max_output_tokens=900, exact=True, route="/v1/completions", model="m"
    )
    assert lengths.expected(facts, 1024) == (900, 900)  # a fresh engine: the client's bound
    lengths.learn_engine_record(record)
    assert lengths.engine_bound() == 200  # the p95 falls in the (100, 200] bucket: its upper bound
    assert lengths.expected(facts, 1024) == (200, 900)
    lengths.record("/v1/completions", "m", 30)
    assert lengths.expected(facts, 1024) == (75, 900)  # our own answers win: 30 x (1.25 + 1.25)
    lengths.learn_engine_record(((50.0, 5.0), (math.inf, 5.0)))
    assert lengths.engine_bound() is None  # too few requests to trust


def test_the_engines_output_length_histogram_is_read_from_its_page() -> None:
    text = (Path(__file__).parents[1] / "data/vllm/vllm-0.32.0-cpu-tiny-kv-pressure.prom").read_text()
    lengths = parse_vllm_metrics(text).generation_lengths
    assert lengths[-1] == (math.inf, 6.0)
    assert dict(lengths)[200.0] == 6.0
    assert dict(lengths)[100.0] == 0.0


def test_a_stream_raises_the_step_clocks_lower_bound_between_scrapes() -> None:
    """A streamed token is an engine step: the lower bound rises to what a stream proves, never falls."""
    clock = StepClock()
    assert not clock.at_least(500)  # before any scrape there is no count to raise
    clock.observe(0.0, 1000)
    clock.observe(1.0, 1200)  # 200 steps/s
    assert not clock.at_least(1100)  # below the scrape's count: nothing new
    assert clock.at_least(1250)
    assert clock.bounds(1.1).low == 1250
    assert clock.at_least(1400)  # faster than the top rate says: the upper bound follows (never below)
    assert clock.bounds(1.1).high == 1400
    assert not clock.at_least(1300)
    clock.observe(1.2, 1300)  # a scrape asked before those tokens came: the stream's count still holds
    assert clock.bounds(1.2).low == 1400
    clock.observe(2.0, 10)  # the engine restarted: what the streams proved is gone with it
    assert clock.bounds(2.0).low == 10


@pytest.mark.parametrize(
    ("truncation", "refused"),
    [
        ({"truncation": "auto"}, False),  # vLLM truncates the input to max_model_len - 1 and serves it
        ({"truncation": None}, False),  # not "disabled": vLLM truncates, then fails its answer (its own 400)
        ({"truncation": "disabled"}, True),
        ({}, True),  # the default is "disabled"
    ],
)
def test_a_responses_input_vllm_truncates_is_not_refused(
    truncation: dict[str, object], refused: bool
) -> None:
    """The real 0.32 server serves a 1,600-token input with ``truncation: "auto"`` (1,023 tokens kept)."""
    body = {"model": "m", "input": "x", "max_output_tokens": 8, **truncation}
    facts = replace(request_facts("/v1/responses", body, EstimatingCounter()), prompts=(1600,), exact=True)
    assert (engine_refusal(facts, MML) is not None) is refused
