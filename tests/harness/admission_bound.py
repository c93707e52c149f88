"""How fast can a spike finish with no preemption at all? A step-count model of vLLM and of two admissions. Pure.

Theory of operation
-------------------
Issue 11 asks capacity admission for two things at once on the admission suite's shapes: no preemption where
straight vLLM preempts fewer than ten times, and the spike done within 1.15x of straight's time. This module
asks what any admission that never lets vLLM preempt could achieve on the suite's own draws, apart from the
sidecar's knowledge of the engine (scrapes, transit, its own CPU): it replays a round in engine steps.

* **The engine** (:func:`engine_schedule`), as vLLM 0.32's V1 scheduler runs it (``vllm/v1/core/sched/
  scheduler.py``, ``Scheduler.schedule``, read as installed): running requests first, oldest first, each
  needing the blocks of every token it has (``KVCacheManager.allocate_slots``: ``cdiv(num_computed +
  num_new_tokens, block_size)``); when one cannot have them, the newest running request is preempted
  (``self.running.pop()``, ``_preempt_request``: its blocks freed, put at the front of the waiting queue, its
  tokens recomputed when it runs again); waiting requests are taken first come, first served only in a step
  that preempted nobody (``if not preempted_reqs``), while a sequence slot is free and the first one's tokens
  fit, stopping at the first that does not. One null block is never handed out (``BlockPool``), so the pool is
  ``num_gpu_blocks - 1``. Each scheduled request produces one token per step; a prefill is one step (the token
  budget, ``max_num_batched_tokens``, is not modelled: the suite's prompts fit in one).
* **A clairvoyant preemption-free admission** (:func:`preemption_free_schedule`): it knows every request's
  exact answer length and progress, and admits a waiting request (smallest first) when, with every running
  request growing one token per step until it ends, the pool holds everyone at every step to come. That is
  the most any admission can let in without vLLM ever running out of blocks, short of reordering to stagger
  peaks; vLLM then never preempts.
* **The sidecar's ledger told the truth** (:func:`ledger_schedule`): the same replay deciding with
  :meth:`sidecar.admission.capacity.CapacityLedger.fits`, each holding's start and progress given exactly (as
  if every scrape were instant and free). Its distance from the measured suite is what the sidecar's
  knowledge of the engine costs; its distance from straight is what never preempting costs.

Steps are not seconds: straight's steps carry recomputed prefills and four sequences, the others' fewer. On
this project's CPU server a decode step of the suite's shapes takes about 2 ms either way (a mid-size round:
~1,800 steps in ~3.5 s straight), so arrivals are placed at ``at / step_seconds``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sidecar.admission.capacity import CapacityLedger, Demand, Margins
from sidecar.admission.geometry import PoolView, blocks_for
from sidecar.admission.rates import Steps
from tests.harness.admission_shapes import Planned


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request of a replay: when it arrives (engine step), its prompt and its exact answer length."""

    step: int
    prompt: int
    output: int


@dataclass(frozen=True, slots=True)
class Engine:
    """The engine's limits: usable blocks (the null block already taken off), block size, sequences."""

    blocks: int
    block_size: int
    max_seqs: int

    def held(self, tokens: int) -> int:
        """Blocks a sequence of ``tokens`` tokens holds."""
        return blocks_for(tokens, self.block_size)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A replay's result: steps until the last answer ended, preemptions, the most blocks in use at once, and
    the step each request ended at (in the order of ``arrivals``)."""

    steps: int
    preemptions: int
    peak_blocks: int
    ends: tuple[int, ...] = ()


@dataclass(slots=True)
class _Running:
    arrival: Arrival
    generated: int = 0  # tokens produced so far; the next step needs blocks for prompt + generated
    blocks: int = 0  # blocks allocated to it now (engine_schedule)
    ended: int | None = None  # the step its last token came at
    holding: int | None = field(default=None)  # the ledger's id, for ledger_schedule


def _tokens_needed(request: _Running) -> int:
    """Tokens whose KV this step writes up to: the prompt (prefill) or every token before the next one."""
    return request.arrival.prompt + request.generated


def arrivals_of(drawn: Sequence[Planned], step_seconds: float) -> list[Arrival]:
    """A suite draw (:func:`tests.harness.admission_shapes.plan`) in engine steps, ``step_seconds`` each."""
    return [Arrival(int(p.at / step_seconds), p.prompt_len, p.kind.max_tokens) for p in drawn]


def _requests(arrivals: Sequence[Arrival]) -> tuple[list[_Running], deque[_Running]]:
    """One record per arrival, in the order of ``arrivals``, and the same records in order of arrival."""
    requests = [_Running(arrival) for arrival in arrivals]
    return requests, deque(sorted(requests, key=lambda r: r.arrival.step))


def _ends(requests: Sequence[_Running]) -> tuple[int, ...]:
    return tuple(-1 if r.ended is None else r.ended for r in requests)


class EngineModel:
    """vLLM 0.32's V1 scheduler in steps (see the module docstring): requests join its waiting queue with
    :meth:`arrive`, :meth:`step` runs one step and returns the requests that ended in it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.waiting: list[_Running] = []
        self.running: list[_Running] = []
        self.steps = self.preemptions = self.peak = 0

    def arrive(self, request: _Running) -> None:
        """A request reaches the scheduler's first-come-first-served queue."""
        self.waiting.append(request)

    def used_blocks(self) -> int:
        """Blocks the running requests hold now."""
        return sum(r.blocks for r in self.running)

    def step(self) -> list[_Running]:
        """One step: running requests first (preempting the newest when one needs a block), then waiting
        ones while a slot is free and their tokens fit, only in a step that preempted nobody."""
        engine, running, waiting = self.engine, self.running, self.waiting
        preempted = False
        scheduled: list[_Running] = []
        for request in list(running):
            if request not in running:
                continue  # preempted earlier in this step
            while engine.held(_tokens_needed(request)) - request.blocks > engine.blocks - self.used_blocks():
                victim = running.pop()
                victim.blocks = 0  # freed; its tokens so far are prefilled again when it runs
                if victim in scheduled:
                    scheduled.remove(victim)
                waiting.insert(0, victim)
                self.preemptions += 1
                preempted = True
                if victim is request:
                    break
            if request in running:
                request.blocks = engine.held(_tokens_needed(request))
                scheduled.append(request)
        while not preempted and waiting and len(running) < engine.max_seqs:
            if engine.held(_tokens_needed(waiting[0])) > engine.blocks - self.used_blocks():
                break
            request = waiting.pop(0)
            request.blocks = engine.held(_tokens_needed(request))
            running.append(request)
            scheduled.append(request)
        self.peak = max(self.peak, self.used_blocks())
        ended = _advance(scheduled, running, self.steps)
        self.steps += 1
        return ended


def engine_schedule(arrivals: Sequence[Arrival], engine: Engine) -> Outcome:
    """Straight to vLLM: admits what fits now, preempts the newest when a running request needs a block."""
    requests, pending = _requests(arrivals)
    model = EngineModel(engine)
    done = 0
    while done < len(arrivals):
        while pending and pending[0].arrival.step <= model.steps:
            model.arrive(pending.popleft())
        done += len(model.step())
    return Outcome(model.steps, model.preemptions, model.peak, _ends(requests))


def _advance(scheduled: list[_Running], running: list[_Running], step: int) -> list[_Running]:
    """Every scheduled request produces a token; returns those that ended (and drops them)."""
    ended = []
    for request in scheduled:
        request.generated += 1
        if request.generated >= request.arrival.output:
            running.remove(request)
            request.ended = step
            ended.append(request)
    return ended


def _peak_with(running: Sequence[_Running], candidate: Arrival, engine: Engine) -> int:
    """The most blocks in use at any step to come if ``candidate`` starts now and nobody else does."""
    lives = [(r.arrival.prompt + r.generated, r.arrival.output - r.generated) for r in running]
    lives.append((candidate.prompt, candidate.output))
    points = {left - 1 for _, left in lives}  # usage only grows until someone's last step
    return max(sum(engine.held(start + at) for start, left in lives if at < left) for at in points)


def _greedy(
    arrivals: Sequence[Arrival], engine: Engine, fits: Callable[[list[_Running], Arrival, int], bool],
    admitted: Callable[[_Running, int], None], ended: Callable[[_Running, int], None],
) -> Outcome:  # fmt: skip
    """Admits the smallest waiting request whose ``fits`` says yes, one step at a time; nothing is preempted."""
    requests, pending = _requests(arrivals)
    waiting: list[_Running] = []
    running: list[_Running] = []
    step = done = peak = 0
    while done < len(arrivals):
        while pending and pending[0].arrival.step <= step:
            waiting.append(pending.popleft())
        refused: set[tuple[int, int]] = set()  # sizes that did not fit this step: their equals do not either
        for request in sorted(waiting, key=lambda r: (r.arrival.prompt + r.arrival.output, r.arrival.step)):
            size = (request.arrival.prompt, request.arrival.output)
            if len(running) >= engine.max_seqs:
                break
            if size in refused:
                continue
            if not fits(running, request.arrival, step):
                refused.add(size)
                continue
            waiting.remove(request)
            running.append(request)
            admitted(request, step)
        peak = max(peak, sum(engine.held(_tokens_needed(r)) for r in running))
        for request in list(running):
            request.generated += 1
            if request.generated >= request.arrival.output:
                running.remove(request)
                request.ended = step
                ended(request, step)
                done += 1
        step += 1
    return Outcome(step, 0, peak, _ends(requests))


def preemption_free_schedule(arrivals: Sequence[Arrival], engine: Engine) -> Outcome:
    """The clairvoyant preemption-free admission (see the module docstring)."""
    return _greedy(
        arrivals, engine, lambda running, arrival, _: _peak_with(running, arrival, engine) <= engine.blocks,
        lambda request, step: None, lambda request, step: None,
    )  # fmt: skip


def ledger_schedule(
    arrivals: Sequence[Arrival], engine: Engine, *, start_within: float | None, max_model_len: int = 1_000_000
) -> Outcome:
    """The sidecar's :class:`CapacityLedger` deciding, every holding's start and progress known exactly.

    ``start_within`` is the start margin the planner gives a request with a free sequence slot (every
    request here has one: :meth:`~sidecar.admission.planner.CapacityPlanner.start_within`; ``None``: the
    ledger's default).
    """
    ledger = CapacityLedger()
    pool = PoolView(engine.blocks, engine.block_size, prefix_caching=False)

    def demand(arrival: Arrival) -> Demand:
        return Demand((arrival.prompt,), 1, arrival.output, arrival.output, max_model_len)

    def fits(running: list[_Running], arrival: Arrival, step: int) -> bool:
        return ledger.fits(demand(arrival), pool, Steps(step, step), Margins(start_within=start_within))

    def admitted(request: _Running, step: int) -> None:
        request.holding = ledger.add(demand(request.arrival), Steps(step, step), float(step))
        ledger.holdings[request.holding].started_high = step

    def ended(request: _Running, step: int) -> None:
        if request.holding is not None:
            ledger.remove(request.holding, float(step))

    return _greedy(arrivals, engine, fits, admitted, ended)
