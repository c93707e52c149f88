"""The admission controller: ``decide`` plus the queue, the block ledger and waiting, on one event loop.

Theory of operation
-------------------
:meth:`AdmissionController.admit` asks :func:`~sidecar.admission.decide.decide` about a request.
*Admit* returns a :class:`Ticket` at once; *refuse* raises :class:`RefusedError`; *queue* puts a
waiter into its lane's :class:`~sidecar.admission.queue.FairQueue` and awaits a future. Whenever
something changes that could let a waiter in (a ticket released, a scrape), :meth:`dispatch` asks
``decide`` again about the head of each lane's queue and grants it while the answer is *admit*; the
head blocks its lane, so nobody overtakes within a lane, except a smaller request that cannot delay a
head waiting for blocks (:mod:`sidecar.admission.backfill`). Under the ``capacity`` policy the short
lane is served first (short requests are never stuck behind long ones), unless the long lane's
head has waited ``long_wait_priority`` seconds: then it goes first and shorts wait behind it until
it fits, so a stream of shorts cannot starve a long request.

A waiter leaves the queue when its client disconnects (its task is cancelled), when its wait limit
passes (503 ``queue-timeout``, a :class:`DroppedError`) or when the sidecar drains (503
``draining``). Every ticket is released exactly once, by the proxy, when the response to the client
has ended; the proxy also reports a stream's progress (:meth:`progress`) and the answer's length,
which teaches :class:`~sidecar.admission.outputs.OutputLengths` what answers on the route take.

Each scrape (:meth:`observe`) feeds the pressure detector, the engine's step clock and the ledger's
view of the live gauge; under sustained pressure the admitted concurrency is capped one step below
what was running and lowered one step per pressure window while usage stays at or above the
release threshold; the cap is lifted when the detector returns to normal.

Staleness is judged by the clock at decision time (:meth:`pressure_state`), not only when a scrape
ends. Everything runs on the one event loop, so no locks are needed. The controller counts the
requests it answers itself (refused, dropped); the proxy counts ``admitted``, ``engine-unavailable``
and ``cancelled``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sidecar.admission.backfill import backfill_entry
from sidecar.admission.body import RequestFacts
from sidecar.admission.count_audit import CountAudit
from sidecar.admission.decide import (
    Action,
    AdmissionConfig,
    AdmissionMode,
    AdmissionView,
    decide,
    lane_of,
)
from sidecar.admission.geometry import PoolView
from sidecar.admission.order import pick_next
from sidecar.admission.outcomes import DroppedError, Lane, Outcome, Reason, RefusedError, reason_message
from sidecar.admission.outputs import OutputSettings
from sidecar.admission.parity import engine_refusal
from sidecar.admission.planner import CapacityPlanner
from sidecar.admission.pressure import ConcurrencyCap, PressureDetector, PressureState, Staleness
from sidecar.admission.queue import FairQueue, QueueEntry
from sidecar.admission.recorder import AdmissionRecorder
from sidecar.admission.retry import ServiceStats
from sidecar.admission.tickets import QueueSettings, Ticket, Waiter, admission_request
from sidecar.admission.waits import WaitAdvisor

__all__ = ["AdmissionController", "AdmissionRecorder", "QueueSettings", "Ticket"]


class AdmissionController:
    """See the module docstring."""

    def __init__(
        self,
        config: AdmissionConfig,
        detector: PressureDetector,
        queue_settings: QueueSettings,
        metrics: AdmissionRecorder,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_model_len: Callable[[], int | None] = lambda: None,
        pool: Callable[[], PoolView | None] = lambda: None,
        kv_samples: Callable[[], list[tuple[float, float]]] = list,
        metrics_age: Callable[[float], float | None] = lambda _now: None,
        staleness: Staleness | None = None,
        outputs: OutputSettings | None = None,
        on_policy: Callable[[AdmissionMode, str], None] | None = None,
        max_num_seqs: Callable[[], int | None] = lambda: None,
        scrape_soon: Callable[[float], None] = lambda _delay: None,
        on_count_mismatch: Callable[[tuple[str, str], int, int], None] | None = None,
    ) -> None:
        self.config, self.detector, self.metrics = config, detector, metrics
        self.queue_settings = queue_settings
        self.staleness = staleness or Staleness()
        self.now = clock
        """The injected clock."""
        self._max_model_len = max_model_len
        self._pool = pool
        self.kv_samples = kv_samples
        """Recent ``(time, KV usage)`` samples from the monitor's history."""
        self._metrics_age = metrics_age
        self._on_policy = on_policy
        self._scrape_soon = scrape_soon
        self.planner = CapacityPlanner(
            pool=pool, max_model_len=max_model_len, outputs=outputs, max_num_seqs=max_num_seqs
        )
        self.queues: dict[Lane, FairQueue[Waiter]] = {
            lane: FairQueue(queue_settings.max_entries, queue_settings.max_tokens) for lane in Lane
        }
        self.inflight: dict[Lane, int] = dict.fromkeys(Lane, 0)
        self.reserved_tokens = 0
        self.stats: dict[Lane, ServiceStats] = {lane: ServiceStats() for lane in Lane}
        self.cap = ConcurrencyCap()
        self._policy: AdmissionMode | None = None
        self._observed = False
        self.draining = False
        self.waits = WaitAdvisor(self)
        self.audit = CountAudit(on_distrust=on_count_mismatch)

    # -- state -------------------------------------------------------------------------------------

    def is_stale(self, now: float) -> bool:
        """Whether the engine's metrics are stale at ``now`` (by the clock, not only when a scrape ends)."""
        age = self._metrics_age(now)
        return self.staleness.is_stale(age is not None, age)

    def pressure_state(self, now: float) -> PressureState:
        """The state admission acts on at ``now``: the detector's, or the stale policy's answer."""
        return self.detector.effective(self.is_stale(now), self.staleness.policy)

    def policy(self) -> AdmissionMode:
        """The policy in effect: ``capacity`` falls back to ``lanes`` while no pool is known."""
        wanted = self.config.mode
        effective = wanted
        why = "configured"
        if wanted is AdmissionMode.CAPACITY and not self.planner.known():
            effective, why = AdmissionMode.LANES, "no KV pool or max_model_len known yet"
        if effective is not self._policy and self._observed:  # said once per change, from the first scrape on
            self._policy = effective
            if self._on_policy is not None:
                self._on_policy(effective, why)
        return effective

    @property
    def total_inflight(self) -> int:
        """Admitted requests whose responses have not ended."""
        return sum(self.inflight.values())

    def view_of(
        self, waiter: Waiter, policy: AdmissionMode, now: float, *, as_head: bool = False
    ) -> AdmissionView:
        """What ``decide`` sees of ``waiter`` (``as_head``: as the next of its lane, nobody before it)."""
        queue, capacity = self.queues[waiter.lane], policy is AdmissionMode.CAPACITY
        fits = not capacity or self.planner.fits(
            waiter.facts, waiter.hashes, now, leave_short_room=self.leaves_short_room(waiter, now)
        )
        pool = self._pool()
        return AdmissionView(
            pressure=self.pressure_state(now) is PressureState.PRESSURE,
            draining=self.draining,
            max_model_len=self._max_model_len(),
            long_inflight=self.inflight[Lane.LONG],
            queued_in_lane=0 if as_head else len(queue),
            queue_has_room=as_head or queue.has_room(waiter.request.reserved_tokens),
            pool_tokens=pool.blocks * pool.block_size if pool else None,
            reserved_tokens=self.reserved_tokens,
            policy=policy,
            fits=fits,
            inflight=self.total_inflight,
            concurrency_cap=self.concurrency_cap,
            sequence_room=self.planner.sequence_room(
                waiter.facts.sequences, waiter.lane, shorts_waiting=len(self.queues[Lane.SHORT]) > 0
            ),
            yield_to_long=(
                not as_head and waiter.lane is Lane.SHORT and capacity and self._long_head_has_waited(now)
            ),
        )

    def leaves_short_room(self, waiter: Waiter, now: float) -> bool:
        """A long request leaves short ones room while no long one has waited its turn."""
        return waiter.lane is Lane.LONG and not self._long_head_has_waited(now)

    # -- admission ---------------------------------------------------------------------------------

    def _grant(self, waiter: Waiter, waited: float, policy: AdmissionMode, *, queued: bool = False) -> Ticket:
        now = self.now()
        in_ledger = policy is AdmissionMode.CAPACITY
        holding = self.planner.hold(waiter.facts, waiter.hashes, now, in_ledger=in_ledger)
        self.inflight[waiter.lane] += 1
        self.reserved_tokens += waiter.request.reserved_tokens
        return Ticket.of(
            waiter.facts,
            waiter.lane,
            waiter.request.reserved_tokens,
            now,
            waited=waited,
            queued=queued,
            holding=holding,
        )

    def count(self, outcome: Outcome, reason: Reason, lane: Lane) -> None:
        """Count one request's outcome (the proxy counts admissions once the engine has the request)."""
        self.metrics.outcome(outcome, reason, lane)

    def lane_of(self, facts: RequestFacts) -> Lane:
        """The lane ``facts`` travels in."""
        return lane_of(facts.prompt_tokens, self.config, self._max_model_len())

    async def admit(self, facts: RequestFacts) -> Ticket:
        """Admit now, or after waiting; raises :class:`RefusedError` or :class:`DroppedError`."""
        wait_limit = self.queue_settings.wait_limit(facts.wait_limit)
        max_model_len = self._max_model_len()
        trusted = self.audit.trusts((facts.route, facts.model))  # exact counts still agree with vLLM's usage
        refusal = engine_refusal(facts, max_model_len, counts_trusted=trusted)
        request = admission_request(facts, max_model_len, refusal.reason if refusal else None)
        now, policy = self.now(), self.policy()
        waiter = Waiter(facts, request, self.lane_of(facts), now, self.planner.hashes(facts))
        if waiter.lane is Lane.SHORT and policy is AdmissionMode.CAPACITY:
            self.planner.saw_short(facts, waiter.hashes, now)
        decision = decide(request, self.view_of(waiter, policy, now), self.config)
        if decision.action is Action.ADMIT:
            return self._grant(waiter, 0.0, policy)
        if decision.action is Action.REFUSE:
            self.count(Outcome.REFUSED, decision.reason, waiter.lane)
            if refusal is not None:
                raise refusal
            raise RefusedError(
                decision.reason,
                reason_message(decision.reason),
                retry_after=self.waits.retry_for(decision.reason, waiter),
            )
        shed = self.waits.shed(waiter, wait_limit) if policy is AdmissionMode.CAPACITY else None
        if shed is not None:
            self.count(Outcome.REFUSED, shed.reason, waiter.lane)
            raise shed
        return await self._wait(waiter, facts.tenant, facts.priority or 0, wait_limit)

    async def _wait(self, waiter: Waiter, tenant: str, priority: int, wait_limit: float) -> Ticket:
        entry = QueueEntry(
            priority=priority, tenant=tenant, tokens=waiter.request.reserved_tokens, payload=waiter
        )
        queue = self.queues[waiter.lane]
        waiter.future = asyncio.get_running_loop().create_future()
        queue.push(entry)
        self.dispatch()
        try:
            async with asyncio.timeout(wait_limit):
                return await asyncio.shield(waiter.future)
        except TimeoutError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                return waiter.future.result()  # granted in the same instant
            position = queue.position(entry)
            queue.remove(entry)
            self._left_queue(waiter, Outcome.DROPPED, Reason.QUEUE_TIMEOUT)
            raise DroppedError(
                Reason.QUEUE_TIMEOUT,
                f"waited {wait_limit:g}s in the {waiter.lane.value} lane's queue for room in the KV cache",
                retry_after=self.waits.retry_for(Reason.QUEUE_TIMEOUT, waiter, position),
            ) from None
        except asyncio.CancelledError:  # the caller counts the cancellation (it knows the whole request)
            if queue.remove(entry):
                self.metrics.queue_wait(waiter.lane, self.now() - waiter.enqueued_at)
            elif waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self.release(waiter.future.result(), completed=False)  # granted, but the client is gone
            raise

    def _left_queue(self, waiter: Waiter, outcome: Outcome, reason: Reason) -> None:
        self.metrics.queue_wait(waiter.lane, self.now() - waiter.enqueued_at)
        self.count(outcome, reason, waiter.lane)

    def _long_head_has_waited(self, now: float) -> bool:
        head = self.queues[Lane.LONG].peek()
        return head is not None and now - head.payload.enqueued_at >= self.config.long_wait_priority

    def _next_entry(self, queue: FairQueue[Waiter], now: float) -> QueueEntry[Waiter] | None:
        """The entry to try next: the head, or under ``capacity`` the most urgent of the next few."""
        if self.policy() is not AdmissionMode.CAPACITY:
            return queue.peek()
        size: Callable[[QueueEntry[Waiter]], int] = lambda e: self.planner.expected_tokens(e.payload.facts)  # noqa: E731
        return pick_next(queue.next_tenant_entries(), size, lambda e: now - e.payload.enqueued_at)

    def _dispatch_lane(self, lane: Lane) -> Waiter | None:
        """Grant the lane's waiters while they are admitted; the next one, left waiting (``None``: nobody).

        Under ``capacity`` the next one is the most urgent waiting request of the tenant whose turn it
        is (shortest expected first, with ageing: see :mod:`sidecar.admission.order`).
        """
        queue = self.queues[lane]
        while (entry := self._next_entry(queue, now := self.now())) is not None:
            waiter = entry.payload
            if waiter.future.done():
                queue.remove(entry)
                continue
            policy = self.policy()
            view = self.view_of(waiter, policy, now, as_head=True)
            if decide(waiter.request, view, self.config).action != Action.ADMIT:
                if (entry := backfill_entry(self, queue, waiter, view, now)) is None:
                    return waiter
                waiter = entry.payload
            queue.take(entry)
            waited = self.now() - waiter.enqueued_at
            self.metrics.queue_wait(lane, waited)
            waiter.future.set_result(self._grant(waiter, waited, policy, queued=True))
        return None

    def dispatch(self) -> None:
        """Grant queued requests while ``decide`` admits the head of their lane (see the module docstring).

        Under ``capacity``, then asks for the scrape that would next let a waiting request in
        (:meth:`~sidecar.admission.planner.CapacityPlanner.scrape_wanted`).
        """
        if not (self.queues[Lane.SHORT] or self.queues[Lane.LONG]):  # the common case: nobody waits
            return
        capacity = self.policy() is AdmissionMode.CAPACITY
        waited = capacity and self._long_head_has_waited(self.now())
        lanes = (Lane.LONG, Lane.SHORT) if waited else (Lane.SHORT, Lane.LONG)  # short requests first
        heads = [self._dispatch_lane(lanes[0])]
        if heads[0] is None or not waited:  # a long head that waited its turn holds shorts back
            heads.append(self._dispatch_lane(lanes[1]))
        shorts = len(self.queues[Lane.SHORT]) > 0  # a head without a sequence slot waits for a release
        blocked = [
            (w.facts, w.hashes, w.lane is Lane.LONG and not waited)
            for w in heads
            if w is not None and self.planner.sequence_room(w.facts.sequences, w.lane, shorts_waiting=shorts)
        ]
        if capacity and blocked and (delay := self.planner.scrape_wanted(self.now(), blocked)) is not None:
            self._scrape_soon(delay)

    def progress(self, ticket: Ticket, generated: int) -> None:
        """A streamed answer has reached ``generated`` events per sequence: dispatch if the planner asks."""
        if self.planner.progress(ticket.holding, generated, self.now()):
            self.dispatch()

    def release(self, ticket: Ticket, *, completed: bool = True) -> None:
        """The response to an admitted request has ended: free its slot and blocks, learn, let waiters in."""
        if ticket.released:
            return
        ticket.released = True
        now = self.now()
        self.inflight[ticket.lane] -= 1
        self.reserved_tokens -= ticket.reserved_tokens
        if completed:
            self.stats[ticket.lane].record(now - ticket.admitted_at)
        taught = ticket.completion_tokens if ticket.teaches_output else None
        key = (ticket.route, ticket.model)
        if self.planner.release(
            ticket.holding, ticket.sequences, now, completed=completed, completion_tokens=taught, key=key,
            counted=ticket.counted, stream_interval=ticket.stream_interval,
        ):  # fmt: skip
            self.metrics.output_sample("stream" if ticket.counted else "usage")
        if completed and ticket.prompt_usage is not None:  # its media's tokens; whether its count was vLLM's
            text = max(ticket.prompts, default=0)
            self.planner.media.learn(key, ticket.media_items, text, ticket.prompt_usage)
            self.audit.record(key, ticket.audited_prompt, ticket.prompt_usage)
        self.dispatch()

    def observe(
        self,
        now: float,
        usage: float | None,
        *,
        stale: bool,
        steps: float | None = None,
        waiting: float | None = None,
        running: float | None = None,
        sampled_at: float | None = None,
    ) -> None:
        """Feed a scrape asked for at ``sampled_at`` (default ``now``): detector, clock, gauge, cap."""
        self._observed = True
        before = self.detector.state
        after = self.detector.observe(now, usage, stale=stale)
        if after is not before:
            self.metrics.transition(after)
        self.planner.observe(
            now, usage, stale=stale, steps=steps, waiting=waiting, running=running, sampled_at=sampled_at
        )
        self._update_cap(now)
        self.dispatch()

    def _update_cap(self, now: float) -> None:
        on = self.policy() is AdmissionMode.CAPACITY and self.pressure_state(now) is PressureState.PRESSURE
        self.cap.update(now, pressure=on, inflight=self.total_inflight, detector=self.detector)

    @property
    def concurrency_cap(self) -> int | None:
        """Requests let in at once under sustained pressure (``None``: no cap)."""
        return self.cap.value

    def start_drain(self) -> None:
        """Refuse new requests and let every queued one go with 503 ``draining``."""
        self.draining = True
        for queue in self.queues.values():
            for entry in queue.drain():
                waiter = entry.payload
                if waiter.future.done():
                    continue
                self._left_queue(waiter, Outcome.DROPPED, Reason.DRAINING)
                waiter.future.set_exception(
                    DroppedError(
                        Reason.DRAINING,
                        "the sidecar is shutting down",
                        retry_after=self.waits.retry_for(Reason.DRAINING, waiter),
                    )
                )
