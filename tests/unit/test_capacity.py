"""The block ledger of capacity admission, at its boundaries: rounding, batches, prefixes, progress, releases."""

from __future__ import annotations

import math

import pytest

from sidecar.admission.body import RequestFacts, request_facts
from sidecar.admission.capacity import CapacityLedger, Demand, Margins
from sidecar.admission.geometry import PoolView, blocks_for
from sidecar.admission.planner import CapacityPlanner
from sidecar.admission.prefix_cache import prefix_hashes, prompt_hashes
from sidecar.admission.rates import Steps
from sidecar.admission.tokens import EstimatingCounter

POOL = PoolView(blocks=15, block_size=128)  # the real CPU engine: 16 blocks, one of them the null block
UNKNOWN = Steps()


def demand(
    prompt: int, output: int, *, bound: int | None = None, choices: int = 1, mml: int = 1024
) -> Demand:
    return Demand((prompt,), choices, output, output if bound is None else bound, mml)


@pytest.mark.parametrize(("tokens", "blocks"), [(0, 0), (1, 1), (128, 1), (129, 2), (256, 2), (257, 3)])
def test_blocks_round_up(tokens: int, blocks: int) -> None:
    assert blocks_for(tokens, 128) == blocks


def test_fifteen_129_token_requests_need_30_blocks_not_1935_tokens() -> None:
    pool = PoolView(blocks=30, block_size=128)
    ledger = CapacityLedger()
    for _ in range(15):
        request = demand(100, 29)  # 129 tokens: 2 blocks each
        assert ledger.fits(request, pool, UNKNOWN)
        ledger.add(request, UNKNOWN)
    assert ledger.projected(UNKNOWN, math.inf, POOL) == 30
    assert not ledger.fits(demand(100, 29), pool, UNKNOWN)
    assert not ledger.fits(demand(1, 0), PoolView(blocks=30, block_size=128), UNKNOWN)  # even one token


def test_every_prompt_of_a_batch_and_every_choice_is_a_sequence() -> None:
    batch = Demand(prompts=(100, 30), choices=3, expected_output=50, output_bound=50, max_model_len=1024)
    # 150 tokens -> 10 blocks of 16, 80 tokens -> 5 blocks; three choices each
    assert CapacityLedger().added_blocks(batch, PoolView(blocks=100, block_size=16)) == 3 * 10 + 3 * 5


def test_a_sequence_never_holds_more_than_max_model_len() -> None:
    assert CapacityLedger().added_blocks(demand(1000, 100), POOL) == 8  # 1,100 capped at 1,024


def test_only_full_prompt_blocks_before_the_last_token_are_shareable() -> None:
    assert len(prefix_hashes(list(range(256)), 128)) == 1  # vLLM recomputes the last token: 255 // 128
    assert len(prefix_hashes(list(range(257)), 128)) == 2
    assert (
        prefix_hashes([1] * 300, 128) != prefix_hashes([2] + [1] * 299, 128)[:2]
    )  # chained: the first differs


def test_a_shared_prefix_is_counted_once() -> None:
    ids = list(range(600))
    hashes = prompt_hashes([ids], POOL)
    same = Demand((600,), 1, 16, 16, 1024, hashes)
    ledger = CapacityLedger()
    ledger.add(same, UNKNOWN)
    assert ledger.added_blocks(same, POOL) == 1  # 5 blocks, 4 of them already held
    other = Demand((600,), 1, 16, 16, 1024, prompt_hashes([[7, *ids[1:]]], POOL))
    assert ledger.added_blocks(other, POOL) == 5
    assert prompt_hashes([ids], PoolView(blocks=15, block_size=128, prefix_caching=False)) == ()


@pytest.mark.parametrize(
    ("held", "new", "added"),
    [
        ({"model": "m"}, {"model": "m"}, 1),  # 5 blocks, 4 held
        ({"model": "m", "cache_salt": "a"}, {"model": "m", "cache_salt": "a"}, 1),
        ({"model": "m", "cache_salt": "a"}, {"model": "m", "cache_salt": "b"}, 5),  # vLLM salts the chain
        ({"model": "m"}, {"model": "m", "cache_salt": "a"}, 5),
        ({"model": "base"}, {"model": "adapter"}, 5),  # a LoRA adapter is named as the model
    ],
)
def test_blocks_are_shared_only_within_a_model_and_cache_salt(
    held: dict[str, object], new: dict[str, object], added: int
) -> None:
    """vLLM keys each block by the request's LoRA adapter and cache salt too (``generate_block_hash_extra_keys``)."""
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    ids = tuple(range(600))
    first, second = (
        RequestFacts((600,), 16, exact=True, prompt_ids=(ids,), **fields)  # type: ignore[arg-type]
        for fields in (held, new)
    )
    planner.hold(first, planner.hashes(first), 0.0, in_ledger=True)
    assert planner.added_blocks(second, planner.hashes(second)) == added


def test_shared_blocks_stay_counted_while_any_holder_runs() -> None:
    ids = list(range(600))
    same = Demand((600,), 1, 16, 16, 1024, prompt_hashes([ids], POOL))
    ledger = CapacityLedger()
    first, second = ledger.add(same, UNKNOWN), ledger.add(same, UNKNOWN)
    assert ledger.projected(UNKNOWN, math.inf, POOL) == 4 + 1 + 1
    ledger.remove(first)
    assert ledger.projected(UNKNOWN, math.inf, POOL) == 4 + 1
    ledger.remove(second)
    assert ledger.projected(UNKNOWN, math.inf, POOL) == 0


def test_an_empty_ledger_always_fits() -> None:
    ledger = CapacityLedger(unexplained=15)
    assert ledger.fits(demand(1000, 24), POOL, UNKNOWN)


def test_without_a_step_clock_holdings_are_at_their_peaks() -> None:
    ledger = CapacityLedger()
    ledger.add(demand(600, 400, bound=1000), UNKNOWN)  # not certain to end: expectation below its bound
    assert not ledger.fits(demand(600, 400), POOL, UNKNOWN)  # 8 + 8 > 15
    assert ledger.fits(demand(24, 16), POOL, UNKNOWN)  # 8 + 1


def test_a_short_request_fits_beside_long_ones_far_from_their_peaks() -> None:
    ledger = CapacityLedger()
    for _ in range(2):  # two long ones (600 + 400: 8 blocks at the peak), just started at step 1000
        ledger.add(demand(600, 400, bound=1000), Steps(low=1000, high=1000))
    short = demand(24, 16)
    assert ledger.fits(short, POOL, Steps(low=1000, high=1010))  # both near 5 blocks for the next 160 steps
    assert not ledger.fits(short, POOL, Steps(low=1000, high=1300))  # 7 + 7 + 1 > 15 within its lifetime


def test_a_long_request_starts_once_the_one_before_is_certain_to_end_in_time() -> None:
    ledger = CapacityLedger()
    ledger.add(demand(600, 400), Steps(low=0, high=0))  # ignore_eos-like: ends after 400 + prefill steps
    candidate = demand(600, 400)
    assert not ledger.fits(candidate, POOL, Steps(low=500, high=500))  # no scrape has shown it running
    ledger.observe_scrape(None, UNKNOWN, POOL, waiting=0, running=1, step_count=0, sampled_at=1.0)
    # the first is certain to end within 400 - progress + 3 prefill + 2 slack steps; the candidate (5 blocks
    # at once, one more per 128 steps) must stay within 7 blocks until then: 600 + (405 - p) <= 896 -> p >= 109
    assert not ledger.fits(candidate, POOL, Steps(low=108, high=108))
    assert ledger.fits(candidate, POOL, Steps(low=109, high=109))
    waiting = CapacityLedger()
    waiting.add(demand(600, 400), Steps(low=0, high=0))
    waiting.observe_scrape(None, UNKNOWN, POOL, waiting=1, running=0, step_count=0, sampled_at=1.0)
    assert not waiting.fits(candidate, POOL, Steps(low=115, high=115))  # it is the one waiting


def test_progress_counts_from_the_scrape_that_showed_the_request_running() -> None:
    """A request staged in vLLM's queue does not progress while it waits there.

    Counting its progress from the admission (or the first scrape after it) took it to be near its end
    while it had only just started: vLLM preempted through the sidecar in a mid-size spike.
    """
    candidate = demand(600, 400)
    ledger = CapacityLedger()
    ledger.add(demand(600, 400), Steps(low=1000, high=1000), now=0.0)
    ledger.observe_scrape(None, UNKNOWN, POOL, waiting=1, running=4, step_count=1010, sampled_at=0.5)
    assert not ledger.fits(candidate, POOL, Steps(low=1200, high=1200))  # still waiting, as far as is known
    ledger.observe_scrape(None, UNKNOWN, POOL, waiting=0, running=4, step_count=1150, sampled_at=1.5)
    assert not ledger.fits(candidate, POOL, Steps(low=1200, high=1200))  # 50 steps along, not 190
    assert ledger.fits(candidate, POOL, Steps(low=1265, high=1265))  # 115 steps since it was seen running
    ledger.observe_scrape(None, UNKNOWN, POOL, waiting=3, running=1, step_count=1300, sampled_at=2.5)
    assert ledger.fits(candidate, POOL, Steps(low=1265, high=1265))  # a running request stays running


@pytest.mark.parametrize(
    ("steps", "blocks"),
    [
        (Steps(low=500, high=510), 6),  # no top rate known: 100 + 510 + one more block, past its expectation
        (Steps(low=500, high=510, at=1.05, top_rate=550), 2),  # 27 steps since admission: its peak
        (Steps(low=500, high=510, at=2.0, top_rate=550), 6),  # a second on, 510 is the tighter bound again
        (Steps(low=500, high=510, at=1.05, top_rate=550).later(100), 3),  # a look ahead: 127 along, past 50
        (Steps(low=500, high=510, at=0.5, top_rate=550), 2),  # a clock before the admission: nothing run yet
    ],
)
def test_progress_is_bounded_by_the_top_rate_since_the_admission(steps: Steps, blocks: int) -> None:
    """Admitted a calm second after the last scrape, an answer expected at 50 tokens looked 510 along.

    Its progress is bounded by the steps since its admission's count, known from below only as the last
    scrape's (0), and by what the engine runs at its top rate in the seconds since the admission (1.0): at
    every decision, not only once a later scrape comes (at the calm interval, a second later).
    """
    ledger = CapacityLedger()
    ledger.add(demand(100, 50, bound=900), Steps(low=0, high=0), now=1.0)
    assert ledger.projected(steps, math.inf, POOL) == blocks


def test_only_the_oldest_holdings_a_scrape_counts_are_shown_running() -> None:
    """vLLM's queue is first come, first served: the newest have not arrived or are the ones waiting."""
    long, short, candidate = demand(600, 400), demand(24, 16), demand(600, 400)
    at = Steps(low=250, high=250)  # the long one 250 steps along: ends within 161; candidate 6 blocks by then

    def ledger(first: Demand, second: Demand, *, waiting: int, running: int) -> CapacityLedger:
        made = CapacityLedger()
        made.add(first, Steps(low=0, high=0), now=0.0)
        made.add(second, Steps(low=0, high=0), now=0.5)
        made.observe_scrape(
            None, UNKNOWN, POOL, waiting=waiting, running=running, step_count=0, sampled_at=1.0
        )
        return made

    assert ledger(long, short, waiting=1, running=1).fits(candidate, POOL, at)  # 8 + 1 + 6 till it ends
    assert not ledger(short, long, waiting=1, running=1).fits(candidate, POOL, at)  # the long one waits
    assert ledger(long, short, waiting=0, running=1).fits(candidate, POOL, at)  # the short one on its way
    assert not ledger(short, long, waiting=0, running=1).fits(candidate, POOL, at)  # the long one, maybe
    assert ledger(short, long, waiting=0, running=2).fits(candidate, POOL, at)
    older = ledger(long, short, waiting=1, running=1)
    older.add(short, at, now=1.5)  # admitted since the scrape: never taken to end
    assert not older.fits(candidate, POOL, at)  # 8 + 1 + 1 + 6
    late = CapacityLedger()
    late.add(long, Steps(low=0, high=0), now=0.9)
    late.observe_scrape(None, UNKNOWN, POOL, waiting=0, running=2, step_count=0, sampled_at=1.0)
    assert not late.fits(candidate, POOL, at)  # someone else runs too: it may have been on its way into vLLM
    late.observe_scrape(None, UNKNOWN, POOL, waiting=0, running=1, sampled_at=2.0)
    assert not late.fits(candidate, POOL, at)  # a scrape without a step count gives no start step


@pytest.mark.parametrize(
    ("admitted", "waiting", "running", "unexplained", "marked"),
    [
        # a lone request the engine counts running is running, however fresh: nobody else could be counted
        ((0.95,), 0, 1, 0, (True,)),
        ((0.95,), 1, 0, 0, (False,)),  # the one waiting
        ((0.95,), 0, 0, 0, (False,)),  # not arrived yet (or done)
        # others use the engine (more counted than the sidecar sent, or blocks it cannot explain): only requests
        # admitted TRANSIT_SECONDS before the scrape can be told apart from theirs
        ((0.95,), 0, 2, 0, (False,)),
        ((0.95,), 0, 1, 3, (False,)),
        ((0.5,), 0, 2, 0, (True,)),
        # two admitted 50 ms apart, one counted running: either may have reached vLLM first
        ((0.90, 0.95), 1, 1, 0, (False, False)),
        ((0.90, 0.95), 0, 1, 0, (False, False)),
        ((0.90, 0.95), 0, 2, 0, (True, True)),
        ((0.10, 0.15), 1, 1, 0, (False, False)),  # long arrived, but in either order
        ((0.50, 0.95), 1, 1, 0, (True, False)),  # far enough apart to be in order
        ((0.50, 0.95), 0, 1, 0, (True, False)),
    ],
)
def test_which_holdings_a_scrape_shows_running(
    admitted: tuple[float, ...], waiting: int, running: int, unexplained: int, marked: tuple[bool, ...]
) -> None:
    ledger = CapacityLedger(unexplained=unexplained)
    keys = [ledger.add(demand(600, 400), Steps(low=0, high=0), now=at) for at in admitted]
    ledger.observe_scrape(None, UNKNOWN, POOL, waiting=waiting, running=running, step_count=7, sampled_at=1.0)
    assert tuple(ledger.holdings[k].started_high == 7 for k in keys) == marked


def test_a_request_with_n_choices_is_counted_as_n_requests() -> None:
    """vLLM fans ``n`` out into child requests, each counted running: two counted may be one request."""
    ledger = CapacityLedger()
    pair = ledger.add(Demand((600,), 2, 200, 200, 1024), Steps(low=0, high=0), now=0.0)
    single = ledger.add(demand(600, 400), Steps(low=0, high=0), now=0.5)
    ledger.observe_scrape(None, UNKNOWN, POOL, waiting=0, running=2, step_count=7, sampled_at=1.0)
    assert ledger.holdings[pair].started_high == 7
    assert ledger.holdings[single].started_high is None  # on its way, or done: not the second one counted


def test_a_request_past_its_expectation_is_expected_to_grow() -> None:
    ledger = CapacityLedger()
    key = ledger.add(demand(100, 100, bound=900), Steps(low=0, high=0))  # learned 100, may run to 900
    assert ledger.projected(Steps(low=0, high=50), 0, POOL) == 2  # 150 tokens
    ledger.holdings[key].generated = 300  # a stream counted 300 tokens
    assert (
        ledger.projected(Steps(low=0, high=300), 0, POOL) == 4
    )  # 400 tokens held; expects 528: 5 at its peak
    assert ledger.projected(Steps(low=0, high=300), math.inf, POOL) == 5


def test_the_gauge_adds_what_the_ledger_cannot_explain() -> None:
    ledger = CapacityLedger()
    ledger.add(demand(100, 28, bound=500), UNKNOWN)  # 1 block, not certain to end
    ledger.observe_scrape(0.6 * 15, UNKNOWN, POOL, waiting=0)  # 9 blocks in use: 8 unexplained
    assert ledger.unexplained == 8
    assert ledger.fits(demand(600, 100), POOL, UNKNOWN)  # 1 + 8 + 6 = 15
    assert not ledger.fits(demand(700, 100), POOL, UNKNOWN)  # 1 + 8 + 7
    ledger.observe_scrape(0.0, UNKNOWN, POOL, waiting=3)
    assert ledger.unexplained == 0


def test_free_blocks() -> None:
    ledger = CapacityLedger(unexplained=2)
    ledger.add(demand(600, 400), UNKNOWN)
    assert ledger.free_blocks(POOL, UNKNOWN) == 15 - 8 - 2


def _running_long(ledger: CapacityLedger) -> None:
    """One 600 + 400 request (8 blocks at its peak), shown running by a scrape at step 0."""
    ledger.add(demand(600, 400), Steps(low=0, high=0))
    ledger.observe_scrape(None, UNKNOWN, POOL, waiting=0, running=1, step_count=0, sampled_at=1.0)


@pytest.mark.parametrize(
    ("progress", "headroom", "full_for", "fits"),
    [
        (108, 0, 0, False),  # the plain rule: the second needs the first 109 steps along (8 + 7 at its end)
        (109, 0, 0, True),
        (109, 1, 128, True),  # full only in the last 128 steps before a certain end: shorts wait that long
        (108, 1, 128, False),  # ...and the plain rule still holds
        (172, 1, 64, False),  # 64 steps before the end: 8 + 7 + 1 > 15
        (173, 1, 64, True),  # 8 + 6 + 1
        (236, 1, 0, False),  # no window: the headroom is kept to the end (8 + 7 + 1)
        (237, 1, 0, True),
    ],
)
def test_headroom_may_be_used_only_just_before_a_certain_end(
    progress: int, headroom: int, full_for: int, fits: bool
) -> None:
    """A long request leaving a short one's block free, except in the last ``full_for`` steps before a release.

    Leaving it free over the whole lifetime kept the second long request of the long-prompt spike out until
    the first was 230 steps along instead of 115 (1.3-1.6x straight's makespan).
    """
    ledger = CapacityLedger()
    _running_long(ledger)
    steps = Steps(low=progress, high=progress)
    assert ledger.fits(demand(600, 400), POOL, steps, Margins(headroom, full_for)) is fits


def test_steps_until_fit_is_when_a_waiting_request_would_fit() -> None:
    ledger = CapacityLedger()
    assert ledger.steps_until_fit(demand(600, 400), POOL, Steps(low=0, high=0)) is None  # nobody to wait for
    ledger.add(demand(600, 400), Steps(low=0, high=0))
    assert ledger.steps_until_fit(demand(600, 400), POOL, Steps(low=50, high=50)) is None  # not shown running
    ledger.observe_scrape(None, UNKNOWN, POOL, waiting=0, running=1, step_count=0, sampled_at=1.0)
    assert ledger.steps_until_fit(demand(600, 400), POOL, Steps(low=50, high=50)) == 59  # at 109 steps along
    assert ledger.steps_until_fit(demand(600, 400), POOL, Steps(low=109, high=109)) == 0
    assert (
        ledger.steps_until_fit(demand(600, 400), POOL, Steps(low=50, high=50), Margins(headroom=1)) == 187
    )  # 237
    # 8 + 8 > 15 while the first is held: only its release lets this one in
    assert ledger.steps_until_fit(demand(900, 124), POOL, Steps(low=50, high=50)) is None


def test_a_request_that_ended_after_the_scrape_was_asked_is_read_as_in_flight_for_it() -> None:
    """Its answer ended while the page was on its way: it is in the page's counts and gauge, not someone else.

    Read as gone, its place in the running count looked like a client bypassing the sidecar, so the two
    requests after it were not taken as running, and their start was read ~100 steps late.
    """
    ledger = CapacityLedger()
    ids = [
        ledger.add(demand(400, 300), Steps(low=at, high=at), now=t)
        for t, at in ((0.0, 0), (0.9, 1000), (0.95, 1000))
    ]
    ledger.remove(ids[0], now=1.05)  # ended after the scrape below was asked for, before it was read
    used = 6 + 4 + 4  # its 400 + 300 tokens and the two newest ones' prompts
    ledger.observe_scrape(
        used, Steps(1000, 1000), POOL, waiting=0, running=3, step_count=1000, sampled_at=1.0
    )
    assert [h.started_high for h in ledger.holdings.values()] == [1000, 1000]
    assert ledger.unexplained == 0
    later = CapacityLedger()
    ids = [later.add(demand(400, 300), Steps(low=0, high=0), now=t) for t in (0.0, 0.9, 0.95)]
    later.remove(ids[0], now=0.9)  # ended before the scrape was asked for: not in its counts
    later.observe_scrape(8, Steps(1000, 1000), POOL, waiting=0, running=3, step_count=1000, sampled_at=1.0)
    assert [h.started_high for h in later.holdings.values()] == [None, None]  # 3 > 2: someone else is there


def test_a_request_that_starts_sooner_is_checked_over_a_shorter_span() -> None:
    """The candidate may start late and end late while the others grow: the span allows for its start.

    A (200 prompt, ~900 out, its end unknown) grows a block every 128 steps; the candidate (1,000 + 24:
    8 blocks at once, 28 steps) fits a 10-block pool beside A only if A has not reached a third block by
    the candidate's latest end: 200 + 28 + 20 = 248 tokens (2 blocks) when it starts within 20 steps,
    200 + 28 + 128 = 356 (3 blocks) when nothing bounds its start.
    """
    pool = PoolView(blocks=10, block_size=128)
    ledger = CapacityLedger()
    ledger.add(Demand((200,), 1, 900, 1000, 2048), Steps(low=0, high=0))
    candidate = Demand((1000,), 1, 24, 24, 2048)
    assert ledger.fits(candidate, pool, Steps(low=0, high=0), Margins(start_within=20))
    assert not ledger.fits(candidate, pool, Steps(low=0, high=0))


def test_steps_until_fit_finds_a_fit_between_two_ends_that_is_gone_after_both() -> None:
    """Two 300-token answers with known ends: a third fits once the first has run a step further, but not
    once both are at their ends (each still a prefill away, every one at its peak): the twin's mid-size case."""
    ledger = CapacityLedger()
    for prompt, admitted, started in ((349, 329, 355), (366, 406, 432)):
        held = ledger.add(demand(prompt, 300), Steps(low=admitted, high=admitted))
        ledger.holdings[held].started_high = started
    candidate, margins = demand(391, 300), Margins(start_within=55)
    assert not ledger.fits(candidate, POOL, Steps(low=537, high=541), margins)
    assert ledger.fits(candidate, POOL, Steps(low=538, high=541), margins)
    assert not ledger.fits(candidate, POOL, Steps(low=537, high=541).later(200), margins)
    assert ledger.steps_until_fit(candidate, POOL, Steps(low=537, high=541), margins) == 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": [1, 2, 3], "cache_salt": "a"}),
        ("/v1/chat/completions", {"messages": "hi", "cache_salt": "a"}),
        ("/v1/responses", {"input": "hi", "cache_salt": "a"}),  # all three of vLLM 0.32's routes take it
    ],
)
def test_the_cache_salt_is_read_from_every_generation_route(path: str, body: dict[str, object]) -> None:
    assert request_facts(path, body, EstimatingCounter()).cache_salt == "a"
