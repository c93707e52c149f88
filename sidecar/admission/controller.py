"""The admission controller: ``decide`` plus the queue, in-flight counts and waiting, on one event loop.

Theory of operation
-------------------
:meth:`AdmissionController.admit` asks :func:`~sidecar.admission.decide.decide` about a request.
*Admit* returns a :class:`Ticket` at once; *refuse* raises :class:`RefusedError`; *queue* puts a
waiter into its lane's :class:`~sidecar.admission.queue.FairQueue` and awaits a future. Whenever
something changes that could let a waiter in (a ticket released, a scrape that ended pressure),
:meth:`AdmissionController.dispatch` asks ``decide`` again about the head of each lane's queue, as if
it were alone, and grants it while the answer is *admit*; the head blocks the lane, so nobody
overtakes within a lane. A waiter leaves the queue at once when its client disconnects (its task is
cancelled), when its wait limit passes (503 ``queue-timeout``, a :class:`DroppedError`) or when the
sidecar drains (503 ``draining``). Every ticket is released exactly once, by the proxy, when the
response to the client has ended, so a long stream holds its slot to the end.

Everything runs on the one event loop, so no locks are needed: state changes happen between awaits.
The controller counts the requests it answers itself (refused, dropped); the proxy counts ``admitted``
once the request has been handed to the engine, ``engine-unavailable`` when it could not, and
``cancelled`` when the client went away first (queued or not).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sidecar.admission.body import RequestFacts
from sidecar.admission.decide import Action, AdmissionConfig, AdmissionRequest, AdmissionView, decide, lane_of
from sidecar.admission.outcomes import DroppedError, Lane, Outcome, Reason, RefusedError
from sidecar.admission.pressure import PressureDetector, PressureState
from sidecar.admission.queue import FairQueue, QueueEntry
from sidecar.admission.retry import (
    ServiceStats,
    clamp_retry_after,
    pressure_wait_estimate,
    queue_wait_estimate,
    usage_fall_rate,
)

WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Limits of each lane's queue."""

    max_entries: int = 1024
    max_tokens: int = 4_000_000
    timeout: float = 30.0


@dataclass(slots=True)
class Ticket:
    """An admitted request's hold on its lane (and on KV tokens in token-budget mode)."""

    lane: Lane
    reserved_tokens: int
    admitted_at: float
    waited: float = 0.0
    queued: bool = False
    released: bool = False


@dataclass(slots=True)
class _Waiter:
    request: AdmissionRequest
    lane: Lane
    enqueued_at: float
    future: asyncio.Future[Ticket] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class AdmissionMetrics:
    """Counters and histograms of admission, on an explicit registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.outcomes = Counter(
            "kv_sidecar_admission",
            "Generation requests by outcome (admitted, refused, dropped, cancelled), reason and lane.",
            ["outcome", "reason", "lane"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "kv_sidecar_queue_wait_seconds",
            "Time generation requests spent in the admission queue, however they left it.",
            ["lane"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.transitions = Counter(
            "kv_sidecar_pressure_transitions",
            "Pressure state changes, by the state entered.",
            ["to"],
            registry=registry,
        )
        for lane in Lane:
            self.queue_wait.labels(lane=lane.value)
            self.outcomes.labels(
                outcome=Outcome.ADMITTED.value, reason=Reason.ADMITTED.value, lane=lane.value
            )
        for state in PressureState:
            self.transitions.labels(to=state.value)


class AdmissionController:
    """See the module docstring."""

    def __init__(
        self,
        config: AdmissionConfig,
        detector: PressureDetector,
        queue_settings: QueueSettings,
        metrics: AdmissionMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_model_len: Callable[[], int | None] = lambda: None,
        pool_tokens: Callable[[], int | None] = lambda: None,
        kv_samples: Callable[[], list[tuple[float, float]]] = list,
    ) -> None:
        self.config = config
        self.detector = detector
        self.queue_settings = queue_settings
        self.metrics = metrics
        self._clock = clock
        self._max_model_len = max_model_len
        self._pool_tokens = pool_tokens
        self._kv_samples = kv_samples
        self.queues: dict[Lane, FairQueue[_Waiter]] = {
            lane: FairQueue(queue_settings.max_entries, queue_settings.max_tokens) for lane in Lane
        }
        self.inflight: dict[Lane, int] = dict.fromkeys(Lane, 0)
        self.reserved_tokens = 0
        self.stats: dict[Lane, ServiceStats] = {lane: ServiceStats() for lane in Lane}
        self.draining = False

    # -- views -------------------------------------------------------------------------------------

    def _view(self, lane: Lane, request: AdmissionRequest, *, as_head: bool = False) -> AdmissionView:
        queue = self.queues[lane]
        return AdmissionView(
            pressure=self.detector.effective is PressureState.PRESSURE,
            draining=self.draining,
            max_model_len=self._max_model_len(),
            long_inflight=self.inflight[Lane.LONG],
            queued_in_lane=0 if as_head else len(queue),
            queue_has_room=as_head or queue.has_room(request.reserved_tokens),
            pool_tokens=self._pool_tokens(),
            reserved_tokens=self.reserved_tokens,
        )

    def _concurrency(self, lane: Lane) -> int:
        if lane is Lane.LONG:
            return self.config.long_lane_concurrency
        return max(1, self.inflight[Lane.SHORT])

    def retry_after(self, reason: Reason, lane: Lane, position: int | None = None) -> int:
        """The ``Retry-After`` seconds for a refusal (see :mod:`sidecar.admission.retry`)."""
        settings = self.detector.settings
        if reason is Reason.KV_PRESSURE:
            now = self._clock()
            samples = self._kv_samples()
            estimate = pressure_wait_estimate(
                self.detector.last_usage,
                usage_fall_rate(samples, now),
                settings.release_threshold,
                settings.window,
                self.stats[Lane.LONG],
            )
            return clamp_retry_after(estimate)
        queue = self.queues[lane]
        ahead = len(queue) if position is None else position
        estimate = queue_wait_estimate(ahead, self._concurrency(lane), self.stats[lane], 2 * settings.window)
        return clamp_retry_after(estimate)

    # -- admission ---------------------------------------------------------------------------------

    def _grant(self, lane: Lane, request: AdmissionRequest, waited: float, *, queued: bool = False) -> Ticket:
        self.inflight[lane] += 1
        self.reserved_tokens += request.reserved_tokens
        return Ticket(
            lane=lane,
            reserved_tokens=request.reserved_tokens,
            admitted_at=self._clock(),
            waited=waited,
            queued=queued,
        )

    def count(self, outcome: Outcome, reason: Reason, lane: Lane) -> None:
        """Count one request's outcome (the proxy counts admissions once the engine has the request)."""
        self._count(outcome, reason, lane)

    def _count(self, outcome: Outcome, reason: Reason, lane: Lane) -> None:
        self.metrics.outcomes.labels(outcome=outcome.value, reason=reason.value, lane=lane.value).inc()

    def admission_request(self, facts: RequestFacts) -> AdmissionRequest:
        """The decision inputs for a request's facts."""
        max_model_len = self._max_model_len()
        return AdmissionRequest(
            prompt_tokens=facts.prompt_tokens,
            sequence_tokens=facts.sequence_tokens(max_model_len),
            reserved_tokens=facts.reserved_tokens(max_model_len),
            count_is_exact=facts.exact,
        )

    def refuse_early(self, reason: Reason, message: str, lane: Lane = Lane.SHORT) -> RefusedError:
        """Count and build a refusal decided before admission (bad body, body too large)."""
        self._count(Outcome.REFUSED, reason, lane)
        return RefusedError(reason, message)

    async def admit(self, facts: RequestFacts, *, tenant: str, priority: int, wait_limit: float) -> Ticket:
        """Admit now, or after waiting; raises :class:`RefusedError` or :class:`DroppedError`."""
        request = self.admission_request(facts)
        lane = lane_of(request.prompt_tokens, self.config, self._max_model_len())
        decision = decide(request, self._view(lane, request), self.config)
        if decision.action is Action.ADMIT:
            return self._grant(lane, request, 0.0)
        if decision.action is Action.REFUSE:
            self._count(Outcome.REFUSED, decision.reason, lane)
            raise RefusedError(decision.reason, _message(decision.reason, request, self._max_model_len()),
                               retry_after=self._retry_for(decision.reason, lane))  # fmt: skip
        return await self._wait(lane, request, tenant, priority, wait_limit)

    def _retry_for(self, reason: Reason, lane: Lane) -> int | None:
        if reason in {Reason.KV_PRESSURE, Reason.QUEUE_FULL, Reason.QUEUE_TIMEOUT}:
            return self.retry_after(reason, lane)
        if reason is Reason.DRAINING:
            return clamp_retry_after(self.detector.settings.window)
        return None

    async def _wait(
        self, lane: Lane, request: AdmissionRequest, tenant: str, priority: int, wait_limit: float
    ) -> Ticket:
        waiter = _Waiter(request=request, lane=lane, enqueued_at=self._clock())
        entry = QueueEntry(priority=priority, tenant=tenant, tokens=request.reserved_tokens, payload=waiter)
        queue = self.queues[lane]
        queue.push(entry)
        self.dispatch()
        try:
            async with asyncio.timeout(wait_limit):
                ticket = await asyncio.shield(waiter.future)
        except TimeoutError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                return waiter.future.result()  # granted in the same instant
            position = queue.position(entry)
            queue.remove(entry)
            self._left_queue(waiter, Outcome.DROPPED, Reason.QUEUE_TIMEOUT)
            raise DroppedError(
                Reason.QUEUE_TIMEOUT,
                f"waited {wait_limit:g}s in the {lane.value} lane's queue without a slot",
                retry_after=self.retry_after(Reason.QUEUE_TIMEOUT, lane, position),
            ) from None
        except asyncio.CancelledError:  # the caller counts the cancellation (it knows the whole request)
            if queue.remove(entry):
                self.metrics.queue_wait.labels(lane=waiter.lane.value).observe(
                    self._clock() - waiter.enqueued_at
                )
            elif waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self.release(waiter.future.result(), completed=False)  # granted, but the client is gone
            raise
        except DroppedError:
            raise
        return ticket

    def _left_queue(self, waiter: _Waiter, outcome: Outcome, reason: Reason) -> None:
        self.metrics.queue_wait.labels(lane=waiter.lane.value).observe(self._clock() - waiter.enqueued_at)
        self._count(outcome, reason, waiter.lane)

    def dispatch(self) -> None:
        """Grant queued requests while ``decide`` admits the head of their lane."""
        for lane, queue in self.queues.items():
            while (entry := queue.peek()) is not None:
                waiter = entry.payload
                if waiter.future.done():
                    queue.remove(entry)
                    continue
                decision = decide(waiter.request, self._view(lane, waiter.request, as_head=True), self.config)
                if decision.action is not Action.ADMIT:
                    break
                queue.pop()
                waited = self._clock() - waiter.enqueued_at
                self.metrics.queue_wait.labels(lane=lane.value).observe(waited)
                waiter.future.set_result(self._grant(lane, waiter.request, waited, queued=True))

    def release(self, ticket: Ticket, *, completed: bool = True) -> None:
        """The response to an admitted request has ended: free its slot and let waiters in."""
        if ticket.released:
            return
        ticket.released = True
        self.inflight[ticket.lane] -= 1
        self.reserved_tokens -= ticket.reserved_tokens
        if completed:
            self.stats[ticket.lane].record(self._clock() - ticket.admitted_at)
        self.dispatch()

    def observe(self, now: float, usage: float | None, *, stale: bool) -> None:
        """Feed a scrape's KV usage to the detector, count transitions, and dispatch."""
        before = self.detector.state
        after = self.detector.observe(now, usage, stale=stale)
        if after is not before:
            self.metrics.transitions.labels(to=after.value).inc()
        self.dispatch()

    def start_drain(self) -> None:
        """Refuse new requests and let every queued one go with 503 ``draining``."""
        self.draining = True
        for lane, queue in self.queues.items():
            for entry in queue.drain():
                waiter = entry.payload
                if waiter.future.done():
                    continue
                self._left_queue(waiter, Outcome.DROPPED, Reason.DRAINING)
                waiter.future.set_exception(
                    DroppedError(
                        Reason.DRAINING,
                        "the sidecar is shutting down",
                        retry_after=self._retry_for(Reason.DRAINING, lane),
                    )
                )

    @property
    def total_inflight(self) -> int:
        """Admitted requests whose responses have not ended."""
        return sum(self.inflight.values())


def _message(reason: Reason, request: AdmissionRequest, max_model_len: int | None) -> str:
    if reason is Reason.CONTEXT_LENGTH_EXCEEDED:
        return (
            f"this request needs {request.sequence_tokens} tokens "
            f"(prompt {request.prompt_tokens} plus output) "
            f"but the model's context length is {max_model_len}: shorten the prompt or lower max_tokens"
        )
    if reason is Reason.KV_PRESSURE:
        return (
            "the KV cache has been above its pressure threshold; long prompts are refused until it recovers"
        )
    if reason is Reason.QUEUE_FULL:
        return "the admission queue is full; retry later"
    if reason is Reason.DRAINING:
        return "the sidecar is shutting down; retry on another replica"
    return reason.value


class AdmissionCollector(Collector):
    """Queue depth, in-flight requests, reserved tokens and the pressure state, read at scrape time."""

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller

    def collect(self) -> list[Metric]:
        """The gauges."""
        controller = self._controller
        depth = GaugeMetricFamily(
            "kv_sidecar_queue_depth", "Requests waiting in the admission queue.", labels=["lane"]
        )
        inflight = GaugeMetricFamily(
            "kv_sidecar_inflight_requests",
            "Admitted generation requests whose responses have not ended.",
            labels=["lane"],
        )
        for lane in Lane:
            depth.add_metric([lane.value], float(len(controller.queues[lane])))
            inflight.add_metric([lane.value], float(controller.inflight[lane]))
        state = GaugeMetricFamily(
            "kv_sidecar_pressure_state", "1 while admission acts under KV pressure (effective state), else 0."
        )
        state.add_metric([], 1.0 if controller.detector.effective is PressureState.PRESSURE else 0.0)
        reserved = GaugeMetricFamily(
            "kv_sidecar_reserved_kv_tokens",
            "KV tokens reserved by in-flight requests (token-budget accounting).",
        )
        reserved.add_metric([], float(controller.reserved_tokens))
        return [depth, inflight, state, reserved]
