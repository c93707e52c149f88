"""Which waiting request goes next, and whether one can be served within its wait limit at all. Pure.

Theory of operation
-------------------
Under the ``capacity`` policy the dispatcher serves the *smallest expected* request first
(shortest-job-first minimises mean waiting time; a short chat turn is not held behind a long
summary), with ageing so nothing starves: a request's urgency key is its expected tokens
(prompts plus expected output, every sequence) divided by ``1 + waited / AGEING_SECONDS``. A
request that has waited two seconds competes at half its size, after twenty at a tenth, so a large
request that keeps being passed over soon outranks fresh small ones. Requests of *similar* size are
served first come, first served: of those whose size is within :data:`SIMILAR_SIZE` of the most
urgent one's, the one that has waited longest goes. Shortest-first only pays when sizes differ;
among near-equals (forty chat turns of 80-120 prompt tokens) it reorders by noise and lengthens the
tail (measured with ``bench/admission_ab.py`` on the generous-max-tokens shape: p95 3.31 s against
2.73 s straight by key alone, 2.79 s first come first served; 2026-12-01). Ageing still works on the
key, so a mid-size request waits as long behind fresh short ones as before (the sustained overload's
short p95 rose from ~1.3 s to ~3.6 s when similarity was judged on the aged key instead of the size).
Priorities and tenants stay in charge: the candidates are the waiting requests of the tenant whose
turn it is in the highest priority band (tenants still take turns, one request each).

Under sustained overload a queue only grows: a request that cannot be served within its wait
limit is better refused at once with an honest ``Retry-After`` than held until it times out. The
wait is estimated from what is ahead of it (in urgency order) and what the engine has been
releasing: ``max(blocks / block rate, requests / request rate)`` over the last 30 s, blocks
counted as planned (what finished requests had reserved), less the blocks free now. Shedding
starts only once the queue is not draining (its oldest request has waited half its wait limit),
so a short spike is queued, never refused; before releases have been seen nothing is shed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from sidecar.admission.retry import capacity_wait_estimate

T = TypeVar("T")

AGEING_SECONDS = 2.0
"""Waiting this long halves a request's urgency key."""


def urgency(expected_tokens: int, waited: float) -> float:
    """The ordering key: lower goes first."""
    return expected_tokens / (1.0 + max(0.0, waited) / AGEING_SECONDS)


SIMILAR_SIZE = 2.0
"""Sizes within this factor of the most urgent request's are near-equals: the oldest of them goes first."""


def pick_next(candidates: Sequence[T], size: Callable[[T], int], waited: Callable[[T], float]) -> T | None:
    """The most urgent candidate, or the longest-waiting one of a size similar to it.

    The most urgent has the lowest :func:`urgency` key; of the candidates whose size is within
    :data:`SIMILAR_SIZE` of its size either way, the one that has waited longest goes (the first of
    equals wins, so the fair order breaks ties).
    """
    measured = [(size(c), waited(c), c) for c in candidates]  # each size once: it is a learned estimate
    if not measured:
        return None
    best = min(measured, key=lambda m: urgency(m[0], m[1]))[0]
    low, high = best / SIMILAR_SIZE, best * SIMILAR_SIZE
    return max((m for m in measured if low <= m[0] <= high), key=lambda m: m[1])[2]


def wait_estimate(  # noqa: PLR0917 - two queues and two rates, each named
    blocks_ahead: int,
    requests_ahead: int,
    own_blocks: int,
    free_blocks: int,
    block_rate: float | None,
    request_rate: float | None,
) -> float | None:
    """Seconds until a request with this much ahead of it can start; ``None`` before any rate is known."""
    blocks_wait = capacity_wait_estimate(blocks_ahead, own_blocks, free_blocks, block_rate)
    if blocks_wait is None or not request_rate:
        return None
    return max(blocks_wait, requests_ahead / request_rate)
