"""Which waiting request goes next, and whether one can be served within its wait limit at all. Pure.

Theory of operation
-------------------
Under the ``capacity`` policy the dispatcher serves the *smallest expected* request first
(shortest-job-first minimises mean waiting time; a short chat turn is not held behind a long
summary), with ageing so nothing starves: a request's urgency key is its expected tokens
(prompts plus expected output, every sequence) divided by ``1 + waited / AGEING_SECONDS``. A
request that has waited two seconds competes at half its size, after twenty at a tenth, so a large
request that keeps being passed over soon outranks fresh small ones. Priorities and tenants stay
in charge: the candidates are the waiting requests of the tenant whose turn it is in the highest
priority band (tenants still take turns, one request each), and the most urgent of them goes.

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


def pick_next(candidates: Sequence[T], key: Callable[[T], float]) -> T | None:
    """The candidate with the lowest key (the first of equals: fair order breaks ties)."""
    return min(candidates, key=key, default=None)


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
