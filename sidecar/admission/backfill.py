"""Backfilling: a smaller waiting request goes ahead of a head that waits for blocks, if it cannot delay it.

Theory of operation
-------------------
Under ``capacity`` the request chosen next in a lane (:mod:`sidecar.admission.order`) blocks the lane while
it does not fit: nobody overtakes it, so ageing can promise it a start. Blocking alone leaves room idle: under
the sustained overload a mid-size request (300 + 200 tokens, 4 blocks of a 15-block pool) that had aged to
the head waited for one of three others to end while the engine's fourth sequence slot stayed empty, about a
sixth of the run (``/status`` sampled every 100 ms, 2026-12-03), and short requests waited behind it.

Batch schedulers solved the same problem with *EASY backfilling* (D. Lifka, "The ANL/IBM SP scheduling
system", JSSPP 1995): reserve the head's start time, and let a later job run now when it does not push that
reservation back. Here the reservation is the ledger's: the head fits ``k`` engine steps from now
(:meth:`~sidecar.admission.capacity.CapacityLedger.steps_until_fit`, from the certain ends of requests a
scrape has shown running). A waiting request may go first when

* the head waits for blocks alone: it has a sequence slot, no pressure cap holds the lane, and ``k`` is known
  (a head whose start nobody can bound is not overtaken: it could be overtaken forever);
* the request would be admitted now as a head itself (it fits beside everyone over its lifetime);
* the engine's sequence limit leaves a slot for both;
* it is certain to be done within ``k`` steps (its expectation is its bound: ``max_tokens`` with
  ``ignore_eos``, or nothing learned below it; its prefill and entry steps counted), or the head still fits
  ``k`` steps from now with it held as well, planned as if it never ended
  (:meth:`~sidecar.admission.planner.CapacityPlanner.backfill_allowed`). A request that goes at once has a
  slot and its blocks, so it starts within the entry steps; if it is slower than planned, the head starts
  later than it would have, but it is still admitted only when the ledger says it fits.

Only the :data:`BACKFILLS` smallest waiting requests of the tenant whose turn it is are tried per round, the
smallest first (each try is a bisection over the ledger). vLLM itself does not backfill: its scheduler stops
at the first waiting request that does not fit (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``:
``allocate_slots`` returning ``None`` for a waiting request ends the loop; checked in vLLM 0.32.0 as
installed), so this changes only the order the sidecar forwards in, never what vLLM does with a request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.admission.decide import Action, AdmissionMode, AdmissionView, decide
from sidecar.admission.outcomes import Lane
from sidecar.admission.queue import FairQueue, QueueEntry
from sidecar.admission.tickets import Waiter

if TYPE_CHECKING:
    from sidecar.admission.controller import AdmissionController

BACKFILLS = 2
"""Waiting requests (the smallest) tried ahead of a head that waits for blocks, per dispatch round."""


def backfill_entry(
    controller: AdmissionController, queue: FairQueue[Waiter], head: Waiter, view: AdmissionView, now: float
) -> QueueEntry[Waiter] | None:
    """A waiting request that may go ahead of ``head`` now (see the module docstring), or ``None``.

    ``view`` is the head's view as the dispatcher decided on it; ``queue`` is the head's lane.
    """
    if view.policy is not AdmissionMode.CAPACITY or view.fits or not view.sequence_room:
        return None
    if view.pressure or view.concurrency_cap is not None:
        return None
    planner = controller.planner
    planned = (head.facts, head.hashes, controller.leaves_short_room(head, now))
    shorts = len(controller.queues[Lane.SHORT]) > 0
    others = [e for e in queue.next_tenant_entries() if e.payload is not head and not e.payload.future.done()]
    for entry in sorted(others, key=lambda e: planner.expected_tokens(e.payload.facts))[:BACKFILLS]:
        waiter = entry.payload
        both = waiter.facts.sequences + head.facts.sequences
        if not planner.sequence_room(both, head.lane, shorts_waiting=shorts):
            continue
        own = controller.view_of(waiter, view.policy, now, as_head=True)
        if decide(waiter.request, own, controller.config).action is not Action.ADMIT:
            continue
        if planner.backfill_allowed(planned, (waiter.facts, waiter.hashes), now):
            return entry
    return None
