"""How long a request should wait: the ``Retry-After`` of a refusal, and shedding under overload.

Theory of operation
-------------------
A client that is told to come back should come back when it will get in (issue 11's "Retry-After that
a client can trust"). :meth:`WaitAdvisor.retry_after` answers, in order:

* ``kv-pressure``: the time for the live gauge to fall from its last value to the release threshold at
  the observed fall rate, at least one pressure window (``retry.pressure_wait_estimate``);
* ``queue-full`` and ``queue-timeout`` under ``capacity``: the wait behind the requests that would go
  before it in the urgency order on its return, as a fresh request of its size (its place in arrival
  order says little there): the larger of their blocks plus its own beyond what is free over the block
  release rate, and their count over the request release rate (:meth:`CapacityPlanner.queue_wait`);
* other reasons under ``capacity`` with a known pool: the blocks queued ahead of the request plus its own,
  beyond what is free, divided by the observed block release rate (:meth:`CapacityPlanner.retry_estimate`);
* otherwise: the requests ahead over the lane's concurrency times its observed service time
  (:func:`~sidecar.admission.retry.queue_wait_estimate`).

:meth:`WaitAdvisor.shed` refuses at once (429 ``queue-full`` with that estimate) a request whose
estimated wait behind the more urgent waiting requests exceeds its wait limit, but only while the queue
is not draining: its oldest request has waited half its limit already. Admitting it would only turn it
into a ``queue-timeout`` later, after it held a place in the queue.

The advisor reads the controller's state and changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.admission.body import RequestFacts
from sidecar.admission.decide import AdmissionMode
from sidecar.admission.order import urgency
from sidecar.admission.outcomes import Lane, Reason, RefusedError
from sidecar.admission.planner import Hashes
from sidecar.admission.retry import (
    clamp_retry_after,
    pressure_wait_estimate,
    queue_wait_estimate,
    usage_fall_rate,
)
from sidecar.admission.tickets import Waiter

if TYPE_CHECKING:
    from sidecar.admission.controller import AdmissionController


class WaitAdvisor:
    """Retry-After values and shedding decisions for one controller (see the module docstring)."""

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller

    def retry_after(
        self, reason: Reason, lane: Lane, position: int | None = None, own_blocks: int = 0
    ) -> int:
        """The ``Retry-After`` seconds for a refusal of a request in ``lane`` at ``position``."""
        c = self._controller
        settings = c.detector.settings
        now = c.now()
        if reason is Reason.KV_PRESSURE:
            estimate = pressure_wait_estimate(
                c.detector.last_usage,
                usage_fall_rate(c.kv_samples(), now),
                settings.release_threshold,
                settings.window,
                c.stats[Lane.LONG],
            )
            return clamp_retry_after(estimate)
        queue = c.queues[lane]
        ahead = len(queue) if position is None else position
        pool = c.planner.pool()
        if c.policy() is AdmissionMode.CAPACITY and pool is not None:
            short = c.queues[Lane.SHORT]
            queued_tokens = queue.tokens + (short.tokens if lane is Lane.LONG else 0)
            queued = len(queue) + (len(short) if lane is Lane.LONG else 0)
            share = ahead / len(queue) if len(queue) else 0.0
            blocks_ahead = pool.sequence_blocks(round(queued_tokens * share if queued else 0))
            capacity = c.planner.retry_estimate(blocks_ahead, own_blocks, now)
            if capacity is not None:
                return clamp_retry_after(capacity)
        concurrency = c.config.long_lane_concurrency if lane is Lane.LONG else max(1, c.inflight[lane])
        return clamp_retry_after(queue_wait_estimate(ahead, concurrency, c.stats[lane], 2 * settings.window))

    def retry_for(self, reason: Reason, waiter: Waiter, position: int | None = None) -> int | None:
        """The ``Retry-After`` for ``waiter`` refused or dropped for ``reason`` (``None``: not retryable).

        Under ``capacity`` a ``queue-full`` or ``queue-timeout`` is told the wait behind the requests that
        would go before it in the urgency order on its return, as a fresh request of its size: its place in
        arrival order says little there (a mid-size request dropped at the head of that order, behind
        shorter ones that kept coming, was told 1 s and waited 18-28 s on its retry).
        """
        c = self._controller
        if reason in {Reason.QUEUE_FULL, Reason.QUEUE_TIMEOUT} and c.policy() is AdmissionMode.CAPACITY:
            now = c.now()
            estimate = c.planner.queue_wait(
                self._ahead(waiter, now, fresh=True), (waiter.facts, waiter.hashes), now
            )
            if estimate is not None:
                return clamp_retry_after(estimate)
        if reason in {Reason.KV_PRESSURE, Reason.QUEUE_FULL, Reason.QUEUE_TIMEOUT}:
            own = c.planner.added_blocks(waiter.facts, waiter.hashes)
            return self.retry_after(reason, waiter.lane, position, own)
        if reason is Reason.DRAINING:
            return clamp_retry_after(c.detector.settings.window)
        return None

    def _urgency(self, waiter: Waiter, now: float) -> float:
        """The waiter's place in the urgency order (lower goes first): see :mod:`sidecar.admission.order`."""
        return urgency(self._controller.planner.expected_tokens(waiter.facts), now - waiter.enqueued_at)

    def _ahead(self, waiter: Waiter, now: float, *, fresh: bool = False) -> list[tuple[RequestFacts, Hashes]]:
        """The waiting requests that go before ``waiter`` (``fresh``: as if it had just come)."""
        c = self._controller
        key = urgency(c.planner.expected_tokens(waiter.facts), 0.0 if fresh else now - waiter.enqueued_at)
        lanes = (Lane.SHORT, Lane.LONG) if waiter.lane is Lane.LONG else (Lane.SHORT,)
        return [
            (e.payload.facts, e.payload.hashes)
            for lane in lanes
            for e in c.queues[lane].peek_many(len(c.queues[lane]))
            if e.payload is not waiter and self._urgency(e.payload, now) <= key
        ]

    def _oldest_wait(self, now: float) -> float:
        heads = [q.peek() for q in self._controller.queues.values()]
        return max((now - e.payload.enqueued_at for e in heads if e is not None), default=0.0)

    def shed(self, waiter: Waiter, wait_limit: float) -> RefusedError | None:
        """A 429 now when what is ahead cannot be served within ``wait_limit`` (else ``None``)."""
        c = self._controller
        now = c.now()
        if not c.planner.known() or self._oldest_wait(now) < wait_limit / 2:
            return None
        estimate = c.planner.queue_wait(self._ahead(waiter, now), (waiter.facts, waiter.hashes), now)
        if estimate is None or estimate <= wait_limit:
            return None
        return RefusedError(
            Reason.QUEUE_FULL,
            f"the queue ahead of this request would take about {estimate:.0f}s to serve, "
            f"more than its {wait_limit:g}s wait limit; retry later",
            retry_after=clamp_retry_after(estimate),
        )
