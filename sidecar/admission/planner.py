"""What the ``capacity`` policy knows about the engine's pool, gathered in one place.

The controller owns the queues and the waiting; this object owns what each decision knows: the block
ledger (:mod:`sidecar.admission.capacity`), the learned answer lengths (:mod:`sidecar.admission.outputs`),
the engine's step clock and block release rate (:mod:`sidecar.admission.rates`) and its sequence limit. No
I/O and no clock of its own: every method takes ``now``; the pool and ``max_model_len`` come from callables
the application wires to what vLLM reports (``cache_config_info``, ``/v1/models``), or to the prediction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from sidecar.admission.body import RequestFacts
from sidecar.admission.capacity import (
    ENTRY_STEPS,
    SHOWN_SLACK_STEPS,
    TRANSIT_SECONDS,
    CapacityLedger,
    Demand,
    Margins,
)
from sidecar.admission.geometry import PoolView
from sidecar.admission.order import wait_estimate
from sidecar.admission.outcomes import Lane
from sidecar.admission.outputs import MediaTokens, OutputLengths, OutputSettings
from sidecar.admission.prefix_cache import prompt_hashes
from sidecar.admission.rates import ReleaseRate, StepClock
from sidecar.admission.retry import capacity_wait_estimate

Hashes = tuple[tuple[int, ...], ...]

STAGED_SEQUENCES = 1
"""Sequences forwarded beyond the engine's limit, to wait in vLLM's own queue: without one, a freed slot
stays empty until the answer's end reaches the sidecar and the next request the engine (tens of ms on a busy
host); vLLM refills it at the next step. It is planned in the ledger like the running ones."""

ENTRY_SECONDS = 0.03
"""About how long an admitted request takes to reach vLLM's scheduler: when a scrape may first show it."""

CLOCK_SECONDS = 0.05
"""How soon a head waiting for blocks asks for a scrape while the engine's step rate is still unknown (a
sidecar started beside an idle engine learns it from the first spike's scrapes; asked at the interval, the
long-prompt spike ran 1.17x straight's time through fresh sidecars against 1.03x, 6 rounds, 2026-12-03)."""
SHORT_HEADROOM_SECONDS = 1.0
"""A long request leaves room for one short request when shorts were seen this recently."""
SHORT_WAIT_STEPS = 128
"""...except in the last this many engine steps before an in-flight request is certain to end: a short
request arriving then waits at most this long. Room kept for long requests' whole lives kept a second one
out until the first was 230 steps along (the long-prompt spike: 1.3-1.6x straight's time)."""


class CapacityPlanner:
    """The ledger, the learned output lengths, the step clock, the release rate, the sequence limit."""

    def __init__(
        self,
        *,
        pool: Callable[[], PoolView | None],
        max_model_len: Callable[[], int | None],
        outputs: OutputSettings | None = None,
        max_num_seqs: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.pool = pool
        self.max_model_len = max_model_len
        self._max_num_seqs = max_num_seqs
        self.ledger = CapacityLedger()
        self.outputs = OutputLengths(outputs or OutputSettings())
        self.media = MediaTokens(OutputLengths(outputs or OutputSettings()))  # tokens per image, audio, video
        self.steps = StepClock()
        self.releases = ReleaseRate()
        self.engine_sequences: int | None = None  # learned: running when the engine last queued requests
        self.inflight_sequences = 0
        self.last_short: tuple[float, int] | None = None  # when a short request last came, and its blocks
        self._last_demand: tuple[RequestFacts, Hashes, PoolView, int, tuple[int, int], Demand] | None = None
        self.wake_at: float | None = None  # the step count at which a head waiting for blocks fits

    def known(self) -> bool:
        """Whether a pool and ``max_model_len`` are known (else ``capacity`` falls back to ``lanes``)."""
        return self.pool() is not None and self.max_model_len() is not None

    # -- one request -------------------------------------------------------------------------------

    def hashes(self, facts: RequestFacts) -> Hashes:
        """The request's shareable prompt blocks (computed once, when it arrives)."""
        pool = self.pool()
        scope = (facts.model, facts.cache_salt)  # vLLM's extra keys: the LoRA the model names, the salt
        return prompt_hashes(facts.prompt_ids, pool, scope) if pool is not None else ()

    def demand(self, facts: RequestFacts, hashes: Hashes) -> Demand | None:
        """The ledger's plan for the request with what is learned now; ``None`` while nothing is known."""
        max_model_len, pool = self.max_model_len(), self.pool()
        if pool is None or max_model_len is None:
            return None
        revision, last = (self.outputs.revision, self.media.lengths.revision), self._last_demand  # asked 3x
        if last is not None and last[:3] == (facts, hashes, pool) and last[3:5] == (max_model_len, revision):
            return last[5]
        expected, bound = self.outputs.expected(facts, max_model_len)  # the room the text alone leaves
        prompts = self.media.planned(facts, max_model_len)
        demand = Demand(prompts, facts.choices, expected, bound, max_model_len, hashes)
        self._last_demand = (facts, hashes, pool, max_model_len, revision, demand)
        return demand

    def fits(
        self, facts: RequestFacts, hashes: Hashes, now: float, *, leave_short_room: bool = False
    ) -> bool:
        """Whether the request fits beside everyone in flight over its lifetime.

        With ``leave_short_room`` (a long request, while no long one has waited its turn) it must also
        leave the blocks of the last short request free when shorts came in the last
        :data:`SHORT_HEADROOM_SECONDS`, except in the last :data:`SHORT_WAIT_STEPS` before a release:
        two long requests may otherwise fill the pool between them for their whole lives, and every
        short one would wait for a long one to end.
        """
        demand, pool = self.demand(facts, hashes), self.pool()
        if demand is None or pool is None:
            return True
        return self.ledger.fits(
            demand, pool, self.steps.bounds(now), self._margins(facts, now, leave_short_room)
        )

    def _margins(self, facts: RequestFacts, now: float, leave_short_room: bool) -> Margins:
        """The short-request room, its window and the request's start margin."""
        room = self._short_room(now, leave_short_room=leave_short_room)
        return Margins(room, SHORT_WAIT_STEPS, self.start_within(facts))

    def start_within(self, facts: RequestFacts) -> float | None:
        """Engine steps within which the request starts if admitted now, or ``None`` when nothing bounds it.

        Bounded only when it has a sequence slot of the engine's own (not a staged one: that waits for a
        release in vLLM's queue) and the gauge shows nobody beside the sidecar's requests: then vLLM schedules
        it as soon as it arrives, within :data:`~sidecar.admission.capacity.TRANSIT_SECONDS`, at the engine's
        highest step rate.
        """
        limit = self.sequence_limit()
        if limit is None or self.ledger.unexplained or self.inflight_sequences + facts.sequences > limit:
            return None
        return self.steps.steps_within(TRANSIT_SECONDS)

    def _short_room(self, now: float, *, leave_short_room: bool) -> int:
        last = self.last_short
        if leave_short_room and last is not None and now - last[0] <= SHORT_HEADROOM_SECONDS:
            return last[1]
        return 0

    def backfill_allowed(
        self, head: tuple[RequestFacts, Hashes, bool], candidate: tuple[RequestFacts, Hashes], now: float
    ) -> bool:
        """Whether ``candidate`` may start ahead of ``head`` (waiting for blocks) without starting it later.

        EASY backfilling, as batch schedulers do it: the head fits ``k`` engine steps from now by the ledger
        (:meth:`CapacityLedger.steps_until_fit`); the candidate may go first when it is done within ``k``
        steps (its expectation is its bound; prefill, answer and :data:`ENTRY_STEPS` take no more), or when
        the head still fits ``k`` steps from now with the candidate held too, as if it never ended. Without a
        ``k`` nothing goes ahead. The caller checks that the candidate fits now and leaves the head a slot.
        An order, never safety: the head is admitted later by :meth:`fits` on what the ledger then holds.
        """
        pool, waiting, extra = self.pool(), self.demand(head[0], head[1]), self.demand(*candidate)
        steps = self.steps.bounds(now)
        if pool is None or waiting is None or extra is None or steps.low is None:
            return False
        margins = self._margins(head[0], now, head[2])
        ahead = self.ledger.steps_until_fit(waiting, pool, steps, margins)
        if ahead is None:
            return False
        if extra.expected_output >= extra.output_bound and extra.lifetime + ENTRY_STEPS <= ahead:
            return True
        later = steps.later(ahead)
        trial = self.ledger.add(extra, steps, now)
        try:
            return self.ledger.fits(waiting, pool, later, margins)
        finally:
            self.ledger.discard(trial)

    def saw_short(self, facts: RequestFacts, hashes: Hashes, now: float) -> None:
        """A short-lane request arrived: long ones leave its blocks free for a while."""
        self.last_short = (now, self.added_blocks(facts, hashes))

    def added_blocks(self, facts: RequestFacts, hashes: Hashes) -> int:
        """Blocks the request would add at its peak."""
        demand, pool = self.demand(facts, hashes), self.pool()
        return self.ledger.added_blocks(demand, pool) if demand and pool else 0

    def expected_tokens(self, facts: RequestFacts) -> int:
        """Prompts plus expected output over every sequence (the urgency order's size)."""
        expected, _ = self.outputs.expected(facts, max_model_len := self.max_model_len() or 0)
        return sum(self.media.planned(facts, max_model_len)) + expected * facts.sequences

    def scrape_wanted(self, now: float, heads: Iterable[tuple[RequestFacts, Hashes, bool]]) -> float | None:
        """Seconds until a scrape would tell a request waiting for blocks something, or ``None``.

        A waiting request starts when the ledger *knows* enough (see :mod:`sidecar.admission.capacity`):
        that a holding runs, which only a scrape after its admission shows, and how far the holdings whose
        end is certain have come, which only the step count of a later scrape shows. So while a head
        (``heads``: each lane's next, with whether it leaves short requests room) waits for blocks, a
        scrape is wanted :data:`ENTRY_SECONDS` after each admission of a request certain to end that no
        scrape has shown yet (for :data:`~sidecar.admission.capacity.TRANSIT_SECONDS`), and when the
        engine, at its recent pace (:meth:`StepClock.pace`), will have run the steps after which a head fits
        (:meth:`CapacityLedger.steps_until_fit`); at the interval each waited half one on average (the
        long-prompt spike: 1.2x straight's time). Heads waiting for a sequence slot ask for nothing: asked
        after every admission under sustained overload, pages slowed the engine itself. While the step rate
        is unknown (no two scrapes saw it step), a head waiting for blocks asks every :data:`CLOCK_SECONDS`.
        """
        pool, rate, steps = self.pool(), self.steps.pace(), self.steps.bounds(now)
        if pool is None:
            return None
        blocked, wanted = False, list[float]()
        self.wake_at = None
        for facts, hashes, leave_short_room in heads:
            demand = self.demand(facts, hashes)
            margins = self._margins(facts, now, leave_short_room)
            if demand is None or self.ledger.fits(demand, pool, steps, margins):
                continue
            blocked = True
            ahead = self.ledger.steps_until_fit(demand, pool, steps, margins)
            if ahead and steps.low is not None:
                self.wake_at = min(steps.low + ahead, self.wake_at or math.inf)
            if ahead and rate > 0:  # counted from the last scrape's count, which the engine has run past
                wanted.append(max(0.0, ahead / rate - self.steps.age(now)))
        if not blocked:
            return None
        if self.steps.max_rate <= 0.0 and self.ledger.holdings:
            wanted.append(CLOCK_SECONDS)
        wanted += [
            max(0.0, held.admitted_at + ENTRY_SECONDS - now)
            for held in self.ledger.holdings.values()
            if held.started_high is None
            and now - held.admitted_at < TRANSIT_SECONDS
            and held.demand.expected_output >= held.demand.output_bound
        ]
        return min(wanted, default=None)

    # -- the engine's sequence limit ---------------------------------------------------------------

    def sequence_limit(self) -> int | None:
        """Sequences let run at once: vLLM's ``--max-num-seqs`` when given, else learned.

        Learned: the most requests vLLM was running at a scrape where it also had requests waiting,
        plus one (a probe: should the engine take more, it shows by running more). Holding the rest
        here rather than in vLLM's first-come-first-served queue is what lets short requests go first.
        """
        configured = self._max_num_seqs()
        if configured is not None:
            return configured
        return None if self.engine_sequences is None else self.engine_sequences + 1

    def sequence_room(self, sequences: int, lane: Lane, *, shorts_waiting: bool) -> bool:
        """Below the engine's limit plus :data:`STAGED_SEQUENCES`; long ones leave waiting shorts a slot."""
        limit = self.sequence_limit()
        if limit is None or self.inflight_sequences == 0:
            return True
        if lane is Lane.LONG and shorts_waiting and limit > 1:
            limit -= 1
        return self.inflight_sequences + sequences <= limit + STAGED_SEQUENCES

    def waits_only_for_sequences(self, waiting: Mapping[Lane, int]) -> bool:
        """Whether no request queued here (``waiting``: how many per lane) could have a sequence slot.

        Those wait for a release, which the proxy sees as a response ends: a scrape tells them nothing,
        so the scraper may wait its calm interval. One that has a slot and still waits is held back by
        blocks, pressure or the long lane's turn, which the next scrapes are what move.
        """
        shorts = waiting.get(Lane.SHORT, 0) > 0
        return not any(
            count and self.sequence_room(1, lane, shorts_waiting=shorts) for lane, count in waiting.items()
        )

    def scrape_can_wait(self, waiting: Mapping[Lane, int]) -> bool:
        """Whether a page could tell capacity admission nothing for a while (the scraper's calm interval).

        Every queued request waits for a slot (:meth:`waits_only_for_sequences`), and the last gauge showed
        nothing beyond the ledger: no client bypasses the sidecar, whose growth only a scrape would show.
        What the sidecar admitted cannot overcommit the pool between scrapes; the ledger planned its peak.
        """
        return self.ledger.unexplained == 0 and self.waits_only_for_sequences(waiting)

    # -- holdings ----------------------------------------------------------------------------------

    def hold(self, facts: RequestFacts, hashes: Hashes, now: float, *, in_ledger: bool) -> int | None:
        """An admitted request: its sequences counted, and (``in_ledger``) its blocks held."""
        self.inflight_sequences += facts.sequences
        demand = self.demand(facts, hashes) if in_ledger else None
        return None if demand is None else self.ledger.add(demand, self.steps.bounds(now), now)

    def progress(self, holding: int | None, generated: int, now: float) -> bool:
        """A streamed answer has reached ``generated`` events per sequence; whether to look at the queue now.

        A stream is a step clock: an event is a step's tokens, speculative ones included, or several steps'
        (merged when the reader lags: ``RequestOutputCollector.put``). Past its first events (a chat stream's
        role event carries no token), the engine has run that many steps since the count read before the
        admission, and the request started that many before the clock's upper bound.
        Look when the first token makes an end certain and, once, when the lower bound reaches `wake_at`.
        """
        held = self.ledger.holdings.get(holding) if holding is not None else None
        if held is None or generated <= held.generated:
            return False
        held.generated, steps, known = generated, self.steps.bounds(now), held.started_high
        proved = generated - SHOWN_SLACK_STEPS
        if steps.high is not None and proved > 0:
            started = steps.high - proved + SHOWN_SLACK_STEPS
            held.started_high = started if known is None else min(known, started)
        floor = None if held.admitted_low is None or proved <= 0 else held.admitted_low + proved
        if floor is None or not self.steps.at_least(floor) or floor < (self.wake_at or math.inf):
            return known is None and held.started_high is not None
        self.wake_at = None  # once: the dispatch asks scrape_wanted again, which sets the next one
        return True

    def release(
        self, holding: int | None, sequences: int, now: float, *, completed: bool,
        completion_tokens: int | None, key: tuple[str, str], counted: bool = False, stream_interval: int = 1,
    ) -> bool:  # fmt: skip
        """A request ended: its sequences and blocks freed, its release rated; whether its length was learned.

        ``counted``: the length is a stream's events, not ``usage``, which are its tokens only when an event
        holds one: not with speculative decoding (a step's, one to ``k + 1`` by the drafts accepted; learned
        so, the generous shape's p95 went from 0.8x straight's to 1.7x), nor with a stream interval above one
        (the request's ``stream_interval`` or the engine's, the larger: an event per that many tokens). Then
        it teaches nothing, and the engine's record stands in (:mod:`sidecar.admission.outputs`).
        """
        self.inflight_sequences -= sequences
        held, pool = self.ledger.remove(holding, now) if holding is not None else None, self.pool()
        batched = max(stream_interval, self.outputs.settings.stream_interval) > 1
        inexact = counted and (batched or (pool is not None and pool.speculative_tokens > 0))
        taught = completion_tokens if completed and not inexact else None
        if taught is not None:
            self.outputs.record(key[0], key[1], math.ceil(taught / max(1, sequences)))
        if held is not None and pool is not None and completed:  # the blocks it had planned for
            self.releases.record(now, self.ledger.added_blocks(held.demand, pool))
        return taught is not None

    # -- scrapes -----------------------------------------------------------------------------------

    def observe(
        self,
        now: float,
        usage: float | None,
        *,
        stale: bool,
        steps: float | None,
        waiting: float | None,
        running: float | None,
        sampled_at: float | None = None,
    ) -> None:
        """A scrape (its page asked for at ``sampled_at``): the step clock, the sequence limit, the gauge."""
        self.steps.observe(now, steps)
        if waiting and running and not stale:
            self.engine_sequences = max(self.engine_sequences or 0, int(running))
        pool = self.pool()
        if not stale and pool is not None:
            self.ledger.observe_scrape(
                None if usage is None else usage * pool.blocks,
                self.steps.bounds(now),
                pool,
                waiting=waiting,
                running=running,
                step_count=steps,
                sampled_at=now if sampled_at is None else sampled_at,
            )

    def engine_record(self, generation_lengths: tuple[tuple[float, float], ...]) -> None:
        """A scrape's view of the engine's output-length histogram: the prior before answers of our own."""
        if generation_lengths:
            self.outputs.learn_engine_record(generation_lengths)

    # -- figures -----------------------------------------------------------------------------------

    def block_figures(self, now: float) -> dict[str, int]:
        """Pool, planned and unexplained blocks (empty while no pool is known)."""
        pool = self.pool()
        if pool is None:
            return {}
        planned = self.ledger.projected(self.steps.bounds(now), math.inf, pool)
        return {"pool": pool.blocks, "planned": planned, "unexplained": self.ledger.unexplained}

    def free_blocks(self, now: float) -> int:
        """Blocks nobody holds or plans for at their peak."""
        pool = self.pool()
        return self.ledger.free_blocks(pool, self.steps.bounds(now)) if pool is not None else 0

    def queue_wait(
        self, ahead: Iterable[tuple[RequestFacts, Hashes]], own: tuple[RequestFacts, Hashes], now: float
    ) -> float | None:
        """Seconds until a request behind ``ahead`` could start (blocks, requests released), or ``None``."""
        waiting = list(ahead)
        return wait_estimate(
            sum(self.added_blocks(facts, hashes) for facts, hashes in waiting),
            len(waiting),
            self.added_blocks(*own),
            self.free_blocks(now),
            self.releases.per_second(now),
            self.releases.requests_per_second(now),
        )

    def retry_estimate(self, blocks_ahead: int, own_blocks: int, now: float) -> float | None:
        """Seconds until ``blocks_ahead`` and ``own_blocks`` are released beyond what is free, or ``None``."""
        return capacity_wait_estimate(
            blocks_ahead, own_blocks, self.free_blocks(now), self.releases.per_second(now)
        )
