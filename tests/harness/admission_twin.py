"""The sidecar's own capacity planner against the step model of vLLM, in simulated time. Pure.

Theory of operation
-------------------
:mod:`tests.harness.admission_bound` asks what never preempting costs, with the ledger told every request's
exact start and progress. Through the real sidecar, mid-size took 1.21x straight's steps against that
model's 1.07x. This replay puts back, one at a time and each with a knob, what the sidecar does *not* know
and how late it learns it, so that what each costs is a number and a change to the planner can be judged in
seconds, without this VM's +-10% between runs:

* **The planner is the sidecar's**: a :class:`~sidecar.admission.planner.CapacityPlanner` with the engine's
  pool, ``max_model_len`` and ``max_num_seqs``, fed as the application feeds it: ``hold`` when a request is
  admitted, ``release`` when its answer has come back, ``observe`` for each scrape, ``scrape_wanted`` to ask
  for one. Its clock is the step count times ``step_seconds``.
* **The engine** is :class:`~tests.harness.admission_bound.EngineModel`, vLLM 0.32's scheduler: what the
  sidecar lets through joins its first-come-first-served queue and starts when a slot is free and its prompt
  fits; it preempts when a running request needs a block and none is free, so an over-admitting planner shows.
* **What the sidecar learns, and when.** An admitted request reaches the engine ``transit_steps`` later; an
  ended one's answer reaches the sidecar ``return_steps`` after its last step. A scrape is read at the scrape
  interval and when the planner asks (never sooner than ``soonest_seconds`` after the last asked one,
  :data:`sidecar.monitor.scraper.SOONEST_SECONDS`); it shows the engine as it is ``scrape_steps`` after it
  was asked (running, waiting, blocks used, steps run) and reaches the planner then.
* **Order among waiting requests**: the smallest expected first, skipping those that do not fit (as
  ``ledger_schedule`` does), so the replay compares knowledge, not order; short requests (prompts under the
  long line) are noted with ``saw_short``, long ones leave them room as the controller's lanes do.

Not modelled: the controller's lanes and ageing, backfilling, the pressure cap, the sidecar's and vLLM's CPU
(steps take ``step_seconds`` whatever runs beside them), prefill chunking.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.admission.body import RequestFacts
from sidecar.admission.decide import AdmissionConfig
from sidecar.admission.geometry import PoolView
from sidecar.admission.outcomes import Lane
from sidecar.admission.planner import CapacityPlanner
from sidecar.monitor.scraper import SOONEST_SECONDS
from sidecar.settings import ScrapeSettings
from tests.harness.admission_bound import Arrival, Engine, EngineModel, Outcome, _ends, _requests, _Running
from tests.harness.vllm import VllmServer

LONG_PROMPT_TOKENS = AdmissionConfig().long_threshold(VllmServer.max_model_len)
"""The long lane's line on the suite's engine: the default, half of ``max_model_len`` (512 tokens)."""


@dataclass(frozen=True, slots=True)
class Knowledge:
    """How late the sidecar learns what the engine does (see the module docstring).

    The lags' defaults are this project's CPU server at ~2 ms a step: a streamed probe's first byte comes
    back 5.8 ms after it is sent at the median, one step and its prefill included (``bench/engine_transit.py``,
    2026-12-05), so about two steps there and one back; a light page is read within a step.
    """

    step_seconds: float = 0.002
    transit_steps: int = 2
    return_steps: int = 1
    scrape_steps: int = 1
    scrape_interval: float = ScrapeSettings().interval
    soonest_seconds: float = SOONEST_SECONDS
    streams: bool = False  # every answer streams: each step's token reaches the sidecar return_steps later


def twin_schedule(arrivals: Sequence[Arrival], engine: Engine, knowledge: Knowledge) -> Outcome:
    """Replay ``arrivals`` through the planner and the engine model; the engine's steps, preemptions, peak."""
    return _Twin(arrivals, engine, knowledge).run()


class _Twin:
    """One replay's state: the planner, the engine model, and what is on its way between them."""

    def __init__(self, arrivals: Sequence[Arrival], engine: Engine, knowledge: Knowledge) -> None:
        pool = PoolView(engine.blocks, engine.block_size, prefix_caching=False)
        self.planner = CapacityPlanner(
            pool=lambda: pool, max_model_len=lambda: 1_000_000, max_num_seqs=lambda: engine.max_seqs
        )
        self.engine, self.knowledge, self.model = engine, knowledge, EngineModel(engine)
        self.requests, self.pending = _requests(arrivals)
        self.facts = {id(r): _facts(r.arrival) for r in self.requests}
        self.indices = {id(r): i for i, r in enumerate(self.requests)}
        self.holdings: dict[int, int | None] = {}
        self.waiting: list[_Running] = []
        self.events: list[tuple[int, int, str, int, int]] = []  # (step, order, kind, index, tokens)
        self.scrapes: list[tuple[int, float]] = []  # (step it is read at, when it was asked)
        self.next_interval, self.last_asked, self.order = 0.0, -1.0, 0
        self.asked_for: float | None = None

    def run(self) -> Outcome:
        """Step until every request has ended."""
        done, model = 0, self.model
        while done < len(self.requests):
            now = model.steps * self.knowledge.step_seconds
            changed = self._arrivals(now) | self._events(now) | self._scrapes(now)
            if changed:  # the controller dispatches on an arrival, a release or a scrape, not every step
                self._dispatch(now)
            for request in model.step():
                done += 1
                self._later(model.steps + self.knowledge.return_steps, "release", request)
            if self.knowledge.streams:
                for request in model.running:
                    self._later(
                        model.steps + self.knowledge.return_steps, "token", request, request.generated
                    )
        return Outcome(model.steps, model.preemptions, model.peak, _ends(self.requests))

    def _later(self, step: int, kind: str, request: _Running, tokens: int = 0) -> None:
        self.order += 1
        heapq.heappush(self.events, (step, self.order, kind, self.indices[id(request)], tokens))

    def _arrivals(self, now: float) -> bool:
        arrived = False
        while self.pending and self.pending[0].arrival.step <= self.model.steps:
            request, arrived = self.pending.popleft(), True
            self.waiting.append(request)
            if request.arrival.prompt < LONG_PROMPT_TOKENS:
                self.planner.saw_short(self.facts[id(request)], (), now)
        return arrived

    def _events(self, now: float) -> bool:
        released = False
        while self.events and self.events[0][0] <= self.model.steps:
            _, _, kind, index, tokens = heapq.heappop(self.events)
            if kind == "enter":
                self.model.arrive(self.requests[index])
            elif kind == "token":
                holding = self.holdings.get(index)
                if holding is not None and tokens and self.planner.progress(holding, tokens, now):
                    released = True  # the controller dispatches when the planner says a head may fit
            else:
                released = True
                holding = self.holdings.pop(index)
                self.planner.release(holding, 1, now, completed=True, completion_tokens=None, key=("", ""))
        return released

    def _scrapes(self, now: float) -> bool:
        step, model = self.model.steps, self.model
        if now >= self.next_interval:  # the interval's round
            self.scrapes.append((step + self.knowledge.scrape_steps, now))
            self.next_interval = now + self.knowledge.scrape_interval
        if self.asked_for is not None and now >= self.asked_for:
            self.scrapes.append((step + self.knowledge.scrape_steps, now))
            self.last_asked, self.asked_for = now, None
        read = [s for s in self.scrapes if s[0] <= step]
        for scrape in read:
            self.scrapes.remove(scrape)
            self.planner.observe(
                now, model.used_blocks() / self.engine.blocks, stale=False, steps=float(model.steps),
                waiting=float(len(model.waiting)), running=float(len(model.running)), sampled_at=scrape[1],
            )  # fmt: skip
        return bool(read)

    def _dispatch(self, now: float) -> None:
        """Admit the smallest waiting requests that fit; ask for the scrape that would let the rest in."""
        planner = self.planner
        blocked: list[tuple[RequestFacts, tuple[()], bool]] = []
        refused: set[tuple[int, int]] = set()  # sizes that did not fit in this dispatch: their equals do not
        for request in sorted(
            self.waiting, key=lambda r: (r.arrival.prompt + r.arrival.output, r.arrival.step)
        ):
            own, long = self.facts[id(request)], request.arrival.prompt >= LONG_PROMPT_TOKENS
            size = (request.arrival.prompt, request.arrival.output)
            if size in refused or not planner.sequence_room(
                1, Lane.LONG if long else Lane.SHORT, shorts_waiting=False
            ):
                continue
            if not planner.fits(own, (), now, leave_short_room=long):
                refused.add(size)
                blocked.append((own, (), long))
                continue
            self.waiting.remove(request)
            self.holdings[self.indices[id(request)]] = planner.hold(own, (), now, in_ledger=True)
            if self.knowledge.transit_steps == 0:
                self.model.arrive(request)
            else:
                self._later(self.model.steps + self.knowledge.transit_steps, "enter", request)
        if blocked and (delay := planner.scrape_wanted(now, blocked)) is not None:
            at = max(now + delay, self.last_asked + self.knowledge.soonest_seconds)
            self.asked_for = at if self.asked_for is None else min(self.asked_for, at)


def _facts(arrival: Arrival) -> RequestFacts:
    """The request as the proxy reads it: token ids (exact), ``max_tokens`` and ``ignore_eos``."""
    return RequestFacts((arrival.prompt,), arrival.output, exact=True, ignore_eos=True)
