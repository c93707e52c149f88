"""The KV block ledger of capacity admission: what in-flight requests hold, now and soon. Pure.

Theory of operation
-------------------
vLLM's scheduler admits a request when its *prompt* fits the free blocks and then allocates one
block at a time as the output grows; when a running request needs a block and none is free, it
preempts the newest running request and recomputes it later (``vllm/v1/core/sched/scheduler.py``,
``Scheduler.schedule``: ``kv_cache_manager.allocate_slots`` returning ``None`` -> ``_preempt_request``).
Admission here prevents that instead of reacting to it: a request is let through only when the pool
can hold what every in-flight request will hold over the new request's lifetime, plus the new one.

* **Blocks, not tokens.** A sequence of ``t`` tokens holds ``ceil(t / block_size)`` blocks
  (``KVCacheManager.allocate_slots``: ``cdiv(num_computed + num_new_tokens, block_size)``), so
  fifteen 129-token sequences need 30 blocks of 128, not 1,935 tokens' worth. A sequence never
  holds more than ``max_model_len`` tokens; every prompt of a batch and each of ``n`` choices is a
  sequence of its own (vLLM fans ``n > 1`` out into child requests, ``vllm/v1/engine/parallel_sampling.py``).
  A hybrid model holds such blocks in each of its KV cache groups, a sliding-window group never more than
  its window's cap (:mod:`sidecar.admission.geometry`, carried by :class:`PoolView`).
* **Expected output.** Each sequence is expected to reach ``prompt + expected_output`` tokens
  (:mod:`sidecar.admission.outputs` decides the figure: the client's ``max_tokens`` or a learned
  quantile of real answer lengths). When a request runs past it, its expectation follows: it is
  then expected to need one more block than it has reached, up to its hard bound.
* **Progress.** vLLM gives every running sequence at least one token per engine step and at most one
  (``k + 1`` with ``k`` speculative tokens: :class:`PoolView`), so the engine's step counter
  (``vllm:iteration_tokens_total``'s sample count) bounds a request's progress from
  both sides: from above by the steps since its admission's count (at least the last scrape's before it),
  the clock extrapolated at the engine's top rate, and by what that rate runs in the seconds since its
  admission (``Steps.most_since``: else a request admitted a calm second after a scrape looks ~500 tokens
  along at once, past a learned expectation of ~170, until a later scrape); from below by steps
  counted since a scrape that showed it running, less its prefill steps and :data:`SHOWN_SLACK_STEPS` (it
  ends no later than that says). The lower bound is the count a scrape read, or what a stream proved since
  (``CapacityPlanner.progress``), never extrapolated: a step can take any time, so no rate
  bounds it from below. A stream's events are progress too. Without a step clock: at its expected peak.
* **The candidate's lifetime.** A new request of expected output ``e`` lives about ``e`` steps, plus
  the steps before it starts: a request that starts late ends late, while the others go on growing. With
  a sequence slot of its own it starts within :data:`TRANSIT_SECONDS` (at the engine's highest step rate);
  otherwise, or while that rate is unknown, ``block_size`` steps are allowed. Over that span the ledger
  evaluates the pool at every point where it could peak: just before each in-flight request is certain
  to end, and at the end of the span. Others grow by the most a step gives, never past their expected
  peak. Only a request whose expectation *is* its hard bound (``max_tokens`` or the context left) is
  certain to end, after at most ``bound - progress + prefill steps`` steps, and only once a scrape has
  shown it running: a request waiting in vLLM's queue, or still on its way there, does not progress, and
  the steps it spent waiting must not be counted as progress. Nobody else is assumed to release anything. So a
  short request fits beside long ones far from their peaks, and a long one may start once the one
  before it is far enough along to be gone before both would need their last blocks.
* **Which holdings a scrape shows running.** vLLM's queue is first come, first served (checked in
  vLLM 0.32.0 as installed: ``vllm/v1/core/sched/request_queue.py``, ``FCFSRequestQueue`` appends and
  pops from the left; ``Scheduler._preempt_request`` prepends a preempted request, which this ledger
  exists to prevent; with ``--scheduling-policy priority`` the queue is ordered by priority instead,
  which is not modelled here). vLLM counts requests, and a holding is ``len(prompts) x n`` of them (each
  prompt of a batch is a request, and ``n`` fans out into child requests, ``parallel_sampling.py``). Of the
  holdings admitted before a scrape was asked for, oldest first, the newest may not have reached the engine
  yet and the next newest are the ``w`` it counts waiting; so the oldest ``min(r, s - w)`` requests, with
  ``s`` the holdings' requests and ``r`` the requests it counts running, are running or done. A request
  still on its way is counted in neither ``r`` nor ``w``, so with nobody else on the engine it cannot be
  among them, however fresh: a holding counts as shown from the first scrape after its admission, not
  :data:`TRANSIT_SECONDS` later. Two exceptions keep the reading safe. Requests admitted within
  :data:`TRANSIT_SECONDS` of each other may reach vLLM in either order, so a holding is not taken as
  shown while one admitted less than that after it is not. And when the engine counts more requests than
  the sidecar has in flight, or its gauge shows blocks the ledger cannot explain, someone else uses it
  (clients bypassing the sidecar): their requests could stand in the counts for a holding still on its way,
  so only holdings admitted :data:`TRANSIT_SECONDS` before the scrape are read. From that scrape on they
  are certain to end, their progress counted from that scrape's step count. A scrape's gauges and its step
  count describe one engine step (``AsyncLLM``'s output handler passes ``scheduler_stats`` and
  ``iteration_stats`` to ``PrometheusStatLogger.record`` together, ``vllm/v1/engine/async_llm.py``), taken
  after the scrape was asked for, so the count bounds the start from above. A request whose answer ended
  after the scrape was asked for may still be in its counts and gauge, so it is read as in flight for that
  scrape (read as gone, it made the counts look like someone else's, and the next start was read ~100 steps
  late). Counting progress from the admission instead let vLLM preempt through the sidecar (a request staged
  in vLLM's queue looked as if it ran). With data-parallel engines (their counts summed) each engine's queue
  is first come, first served but which engine took which request is unknown: the reading is approximate.
* **Shared prefixes.** With prefix caching on (``cache_config_info``'s ``enable_prefix_caching``),
  a full prompt block whose tokens (and all before it) equal a block already held by a running
  request is shared, not allocated again (``BlockPool.get_cached_block``, ``ref_cnt`` incremented
  in ``KVCacheManager.get_computed_blocks``). The ledger keys such blocks by a chained hash of
  exact token ids and counts each distinct one once. Blocks of *finished* requests stay cached but
  count as free in vLLM's usage (``BlockPool.get_usage``: ``1 - free / total``, cached blocks with
  no holder sit in the free queue), so re-using them still takes pool room: only blocks held by
  requests in flight are shared. When every block of a prompt hits, vLLM recomputes the last token
  (``max_cache_hit_length = num_tokens - 1``), so only ``floor((prompt - 1) / block_size)`` blocks
  can be shared.
* **The gauge.** Whatever vLLM reports in use beyond what the ledger accounts for at that scrape
  (clients bypassing the sidecar, a wrong pool) is added as ``unexplained`` blocks until the next
  scrape: the live gauge is trusted over the estimate whenever it is higher.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from sidecar.admission.geometry import GroupLayout, PoolView
from sidecar.admission.rates import Steps

PREFILL_TOKENS_PER_STEP = 256
"""A conservative prefill chunk: a prompt of ``p`` tokens is taken to need ``p / 256`` steps."""
ENTRY_STEPS = 8
"""Steps the engine may run between a request's admission and its arrival in vLLM's scheduler, when no
scrape has shown it yet (the HTTP hop, the API server, the hand-off to the engine core)."""
SHOWN_SLACK_STEPS = 2
"""Steps a request in a scrape's ``running`` count may start after that scrape's step count: with async
scheduling vLLM schedules a batch before the previous one's statistics are recorded (two in flight)."""
TRANSIT_SECONDS = 0.1
"""The most a request takes from its admission to vLLM's scheduler: two admitted closer than this may
arrive in either order, a scrape asked sooner may not show it, and one admitted with a free sequence
slot starts within it. The round trip of a streamed 8-token request under load, one step included, took
at most 29-31 ms here (p99 20-21 ms; ``bench/engine_transit.py``, 2026-12-04)."""
ENDED_SECONDS = 5.0
"""Holdings that ended this recently are kept for reading scrapes asked for before they ended."""
MAX_RELEASE_POINTS = 32
"""Releases considered per decision (the nearest); later ones are treated as never happening."""
UNTIL_FIT_SCANS = 16
"""Strides :meth:`CapacityLedger.steps_until_fit` scans the span to the last certain end in."""


@dataclass(frozen=True, slots=True)
class Demand:
    """A request's sequences as the ledger plans them."""

    prompts: tuple[int, ...]  # prompt tokens of each prompt
    choices: int  # sequences per prompt
    expected_output: int  # tokens each sequence is expected to generate
    output_bound: int  # tokens each sequence may generate at most
    max_model_len: int
    hashes: tuple[tuple[int, ...], ...] = ()  # per prompt, when its token ids are known and caching is on

    def _hashed(self, index: int) -> int:
        return len(self.hashes[index]) if index < len(self.hashes) else 0

    def sequence_peak(self, prompt: int, generated: int, block_size: int) -> int:
        """Tokens one sequence is expected to reach, having generated ``generated`` so far."""
        expected = self.expected_output
        if generated >= expected:  # past its expectation: one more block than it has reached
            expected = generated + block_size
        return min(prompt + min(expected, self.output_bound), self.max_model_len)

    def private_blocks(self, generated: int, horizon: float, pool: PoolView) -> int:
        """Blocks of this request not shared with others, ``horizon`` tokens from now."""
        total = 0
        for index, prompt in enumerate(self.prompts):
            peak = self.sequence_peak(prompt, generated, pool.block_size)
            reach = min(peak, prompt + generated + horizon * pool.tokens_per_step)  # horizon in steps
            total += self.choices * pool.running_blocks(int(reach), self.max_model_len) - self._hashed(index)
        return total

    @property
    def sequences(self) -> int:
        """Requests vLLM counts for it: one per prompt and choice (``n`` fans out into child requests)."""
        return len(self.prompts) * self.choices

    @property
    def all_hashes(self) -> set[int]:
        """Every shareable block hash of the request."""
        return {h for per_prompt in self.hashes for h in per_prompt}

    @property
    def lifetime(self) -> int:
        """Engine steps the request is expected to run (its prefill included)."""
        return self.expected_output + sum(math.ceil(p / PREFILL_TOKENS_PER_STEP) for p in self.prompts)


@dataclass(slots=True)
class Holding:
    """One admitted request's place in the ledger, with its admission step bounds."""

    demand: Demand
    admitted_low: float | None  # the step count at admission, from below (see "Progress")
    admitted_at: float = 0.0  # the sidecar's clock at admission
    started_high: float | None = None  # the step count at the first scrape that showed it running
    generated: int = 0  # events seen streaming back (per sequence): at most its tokens
    _peak: tuple[int, GroupLayout, int] | None = field(default=None, init=False, repr=False)

    def peak_blocks(self, pool: PoolView) -> int:
        """Private blocks at its expected peak while it has not run past its expectation (kept once asked)."""
        peak = self._peak
        if peak is None or peak[0] != pool.block_size or peak[1] != pool.layout:
            peak = self._peak = (pool.block_size, pool.layout, self.demand.private_blocks(0, math.inf, pool))
        return peak[2]

    def progress_high(self, steps: Steps, tokens_per_step: int = 1) -> int | None:
        """At most this many tokens generated, at most ``tokens_per_step`` a step (``None``: unknown)."""
        if steps.high is None or self.admitted_low is None:
            return None
        high = steps.high - self.admitted_low
        if (timed := steps.most_since(self.admitted_at)) is not None:
            high = min(high, timed)
        return max(self.generated, int(high * tokens_per_step))

    def progress_low(self, step_low: float | None) -> int:
        """At least this many steps run since a scrape showed it running (streamed tokens when known)."""
        if step_low is None or self.started_high is None:
            return self.generated
        return max(self.generated, int(step_low - self.started_high))

    def steps_left(self, step_low: float | None) -> float:
        """Steps until it is certain to have ended, or ``inf`` when nothing bounds its end.

        Unbounded until a scrape has shown it running, or when its expectation is below its bound.
        """
        demand = self.demand
        if demand.expected_output < demand.output_bound or self.started_high is None:
            return math.inf
        prefill = sum(math.ceil(p / PREFILL_TOKENS_PER_STEP) for p in demand.prompts) + SHOWN_SLACK_STEPS
        return max(0, demand.output_bound - self.progress_low(step_low)) + prefill


@dataclass(frozen=True, slots=True)
class Margins:
    """What a candidate must leave free, and how late it may start (:meth:`CapacityLedger.fits`)."""

    headroom: int = 0  # blocks left free...
    full_for: float = 0.0  # ...except in the last this many steps before a certain end
    start_within: float | None = None  # steps within which it starts (None: unknown, one block's worth)


NO_MARGINS = Margins()


@dataclass(slots=True)
class CapacityLedger:
    """In-flight holdings, their shared prefix blocks, and the gauge's unexplained blocks."""

    holdings: dict[int, Holding] = field(default_factory=dict)
    shared: Counter[int] = field(default_factory=Counter)
    unexplained: int = 0
    _next_id: int = 0
    ended: deque[tuple[float, Holding]] = field(default_factory=deque)  # (when, holding): the last seconds

    def add(self, demand: Demand, steps: Steps, now: float = 0.0) -> int:
        """Hold ``demand`` from ``now``; returns the holding's id."""
        self._next_id += 1
        self.holdings[self._next_id] = Holding(demand, steps.low, now)
        self.shared.update(demand.all_hashes)
        return self._next_id

    def discard(self, holding_id: int) -> Holding | None:
        """Drop a holding without recording an end (a trial placement, not a request that ended)."""
        holding = self.holdings.pop(holding_id, None)
        if holding is not None:
            self.shared.subtract(holding.demand.all_hashes)
            self.shared = +self.shared
        return holding

    def remove(self, holding_id: int, now: float = -math.inf) -> Holding | None:
        """The request ended at ``now``: drop its holding."""
        if (holding := self.discard(holding_id)) is not None:
            self.ended.append((now, holding))
        while self.ended and self.ended[0][0] < now - ENDED_SECONDS:
            self.ended.popleft()
        return holding

    def _private(self, holding: Holding, steps: Steps, horizon: float, pool: PoolView) -> int:
        done = holding.progress_high(steps, pool.tokens_per_step)
        if done is None:
            done, horizon = holding.generated, math.inf
        if math.isinf(horizon) and done < holding.demand.expected_output:
            return holding.peak_blocks(pool)  # the same figure as below, asked on every decision
        return holding.demand.private_blocks(done, horizon, pool)

    def projected(self, steps: Steps, horizon: float, pool: PoolView) -> int:
        """Blocks every holding may hold ``horizon`` steps from now if nobody ends (shared blocks once)."""
        return len(self.shared) + sum(
            self._private(holding, steps, horizon, pool) for holding in self.holdings.values()
        )

    def added_blocks(self, demand: Demand, pool: PoolView) -> int:
        """Blocks ``demand`` adds at its peak, beyond prefix blocks already held."""
        new_shared = sum(1 for h in demand.all_hashes if h not in self.shared)
        return demand.private_blocks(0, math.inf, pool) + new_shared

    def fits(self, demand: Demand, pool: PoolView, steps: Steps, margins: Margins = NO_MARGINS) -> bool:
        """Whether ``demand`` fits beside everyone over its lifetime, leaving ``margins.headroom`` free.

        The headroom may be used in the last ``margins.full_for`` steps before each certain end (usage
        only grows between releases): a request needing it then waits at most that long.
        ``margins.start_within``: the steps within which the request is certain to start (``None``: unknown,
        taken as ``block_size``, about a transit at the highest step rates seen). A request that starts late
        ends late: others go on growing while it sits at its peak, so the pool is checked up to its latest
        end. With nothing of the sidecar's in flight the answer is yes, whatever the gauge says: waiting for
        blocks held by others (clients bypassing the sidecar) could last forever, and vLLM queues a request
        it cannot place yet by itself.
        """
        if not self.holdings:
            return True
        headroom, full_for, start_within = margins.headroom, margins.full_for, margins.start_within
        lifetime = demand.lifetime + (pool.block_size if start_within is None else start_within)
        new_shared = sum(1 for h in demand.all_hashes if h not in self.shared)
        base = len(self.shared) + new_shared + self.unexplained
        peaks = base + headroom + demand.private_blocks(0, math.inf, pool)
        if (
            peaks + sum(self._private(h, steps, math.inf, pool) for h in self.holdings.values())
            <= pool.blocks
        ):
            return True  # everyone at their peak at once fits: no need to look at when they end
        ends = {key: holding.steps_left(steps.low) for key, holding in self.holdings.items()}
        points = sorted(t for t in ends.values() if t < lifetime)[:MAX_RELEASE_POINTS]
        considered = set(points)
        checks = [(point, 0) for point in [*points, lifetime]]
        if headroom:
            checks += [(max(0.0, point - full_for), headroom) for point in [*points, lifetime]]
        for at, room in checks:
            total = base + room + demand.private_blocks(0, at, pool)
            for key, holding in self.holdings.items():
                end = ends[key]
                if end >= at or end not in considered:
                    total += self._private(holding, steps, at, pool)
            if total > pool.blocks:
                return False
        return True

    def steps_until_fit(
        self, demand: Demand, pool: PoolView, steps: Steps, margins: Margins = NO_MARGINS
    ) -> float | None:
        """About how many engine steps from now :meth:`fits` first says yes if nobody comes or goes, or None.

        When to look again, never a decision. Bisected as if the answer only grew with progress; it does not
        always: past the last certain end every holding is at its peak at once (its end still a prefill
        away). When it fails there, the span is scanned in :data:`UNTIL_FIT_SCANS` strides for the first fit
        (else mid-size heads in the twin found no answer for 1,224 steps with one a step away).
        """
        low = steps.low
        ends = [end for h in self.holdings.values() if not math.isinf(end := h.steps_left(low))]
        if low is None or not ends:
            return None

        def fits_after(ahead: float) -> bool:
            return self.fits(demand, pool, steps.later(ahead), margins)

        if fits_after(0.0):
            return 0.0
        below, above = 0, math.ceil(max(ends)) + 1
        if not fits_after(above):
            stride = max(1, math.ceil(above / UNTIL_FIT_SCANS))
            found = next((at for at in range(stride, above, stride) if fits_after(at)), None)
            if found is None:
                return None
            below, above = found - stride, found
        while above - below > 1:
            middle = (below + above) // 2
            below, above = (below, middle) if fits_after(middle) else (middle, above)
        return above

    def _mark_running(
        self, step_count: float, sampled_at: float, *, waiting: float | None, running: float | None
    ) -> None:
        """Give the holdings the scrape shows running its step count (the theory of operation says which)."""
        ordered = sorted(
            [*self._ended_since(sampled_at), *self.holdings.values()], key=lambda h: h.admitted_at
        )
        counted = (running or 0) + (waiting or 0)
        others = counted > sum(h.demand.sequences for h in ordered) or self.unexplained > 0
        seen = sampled_at - (TRANSIT_SECONDS if others else 0.0)
        before = [h for h in ordered if h.admitted_at < seen]
        shown = sum(h.demand.sequences for h in before) - math.ceil(waiting or 0)
        if running is not None:
            shown = min(shown, math.floor(running))
        prefix = 0
        for holding in before:
            if holding.demand.sequences > shown:
                break
            shown -= holding.demand.sequences
            prefix += 1
        boundary = ordered[prefix].admitted_at if prefix < len(ordered) else math.inf
        for holding in before[:prefix]:
            if holding.started_high is None and holding.admitted_at <= boundary - TRANSIT_SECONDS:
                holding.started_high = step_count

    def free_blocks(self, pool: PoolView, steps: Steps) -> int:
        """Blocks not held or planned for by anyone at their peaks."""
        return pool.blocks - self.projected(steps, math.inf, pool) - self.unexplained

    def observe_scrape(
        self,
        used_blocks: float | None,
        steps: Steps,
        pool: PoolView,
        *,
        waiting: float | None,
        running: float | None = None,
        step_count: float | None = None,
        sampled_at: float = -math.inf,
    ) -> None:
        """A scrape asked at ``sampled_at``.

        Holdings it shows running ("Which holdings a scrape shows running") get its step count as the latest
        step they started at; the gauge's ``used_blocks`` beyond what the ledger explains is kept.
        """
        if step_count is not None:
            self._mark_running(step_count, sampled_at, waiting=waiting, running=running)
        if used_blocks is not None:
            ended = sum(
                self._private(h, steps, 0, pool) + len(h.demand.all_hashes)
                for h in self._ended_since(sampled_at)
            )
            explained = self.projected(steps, 0, pool) + ended
            self.unexplained = max(0, math.ceil(used_blocks - explained - 1e-9))

    def _ended_since(self, sampled_at: float) -> list[Holding]:
        return [holding for at, holding in self.ended if at >= sampled_at]
