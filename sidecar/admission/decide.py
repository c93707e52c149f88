"""``decide``: admit, queue or refuse one generation request. Pure.

Theory of operation
-------------------
The sidecar keeps two lanes, split at ``long_prompt_tokens`` prompt tokens (default: half of
``max_model_len`` when known, else 16,384: the seeds' "16K of 32K"). The order of the questions
is the contract:

1. **Never fits**: prompt + output (per sequence) > ``max_model_len`` -> 400
   ``context-length-exceeded``; vLLM would refuse it anyway, so it never reaches the engine. Only
   asked when the prompt count is exact (tokenizer, token ids) or bounded by the body size.
2. **Draining** -> 503 ``draining``.
3. **Pressure** (the detector's effective state is ``PRESSURE``): long requests queue
   (``--on-pressure queue``) or are refused with 429 ``kv-pressure`` (``reject``); short ones pass.
4. **Behind others**: if the request's lane already has a queue, it queues (no overtaking).
5. **Token budget** (``--admission token-budget``): every in-flight request reserves its peak KV
   tokens (prompt + output) against the engine's pool; a request that does not fit the remainder
   queues. This prevents preemption instead of reacting to it.
6. **Long-lane cap**: at most ``long_lane_concurrency`` long requests run at once (default 1: the
   seed's "one lane to itself"); the rest queue.
7. Otherwise: admit.

A "queue" decision becomes 429 ``queue-full`` when the lane's queue has no room.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.admission.outcomes import Lane, Reason

DEFAULT_LONG_PROMPT_TOKENS = 16_384


class Action(StrEnum):
    """What to do with a request."""

    ADMIT = "admit"
    QUEUE = "queue"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """The admission flags."""

    long_prompt_tokens: int | None = None  # None: half of max_model_len, else 16384
    long_lane_concurrency: int = 1
    on_pressure: str = "queue"  # or "reject"
    mode: str = "lanes"  # or "token-budget"

    def long_threshold(self, max_model_len: int | None) -> int:
        """The prompt size at which a request joins the long lane."""
        if self.long_prompt_tokens is not None:
            return self.long_prompt_tokens
        return max_model_len // 2 if max_model_len else DEFAULT_LONG_PROMPT_TOKENS


@dataclass(frozen=True, slots=True)
class AdmissionView:
    """What the sidecar knows when it decides."""

    pressure: bool
    draining: bool
    max_model_len: int | None
    long_inflight: int
    queued_in_lane: int
    queue_has_room: bool
    pool_tokens: int | None = None  # the engine's KV pool, for token-budget mode
    reserved_tokens: int = 0  # tokens reserved by in-flight requests


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """The request as admission sees it."""

    prompt_tokens: int
    sequence_tokens: int  # prompt + output of one sequence (open-ended output: max_model_len)
    reserved_tokens: int  # peak KV tokens over all choices
    count_is_exact: bool  # only an exact prompt count may refuse with 400


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict: an action, the lane and the reason."""

    action: Action
    lane: Lane
    reason: Reason


def lane_of(prompt_tokens: int, config: AdmissionConfig, max_model_len: int | None) -> Lane:
    """The lane a prompt of ``prompt_tokens`` travels in."""
    return Lane.LONG if prompt_tokens >= config.long_threshold(max_model_len) else Lane.SHORT


def decide(  # noqa: PLR0911 - one return per question, in the documented order
    request: AdmissionRequest, view: AdmissionView, config: AdmissionConfig
) -> Decision:
    """Admit, queue or refuse; see the module docstring for the order of the questions."""
    lane = lane_of(request.prompt_tokens, config, view.max_model_len)
    if (
        view.max_model_len is not None
        and request.count_is_exact
        and request.sequence_tokens > view.max_model_len
    ):
        return Decision(Action.REFUSE, lane, Reason.CONTEXT_LENGTH_EXCEEDED)
    if view.draining:
        return Decision(Action.REFUSE, lane, Reason.DRAINING)
    queue = (
        Decision(Action.QUEUE, lane, Reason.QUEUED)
        if view.queue_has_room
        else (Decision(Action.REFUSE, lane, Reason.QUEUE_FULL))
    )
    if view.pressure and lane is Lane.LONG:
        if config.on_pressure == "reject":
            return Decision(Action.REFUSE, lane, Reason.KV_PRESSURE)
        return queue
    if view.queued_in_lane > 0:
        return queue
    if (
        config.mode == "token-budget"
        and view.pool_tokens is not None
        and view.reserved_tokens > 0
        and view.reserved_tokens + request.reserved_tokens > view.pool_tokens
    ):
        return queue
    if lane is Lane.LONG and view.long_inflight >= config.long_lane_concurrency:
        return queue
    return Decision(Action.ADMIT, lane, Reason.ADMITTED)
