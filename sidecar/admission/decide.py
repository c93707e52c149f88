"""``decide``: admit, queue or refuse one generation request. Pure.

Theory of operation
-------------------
Three policies (``--admission``), one order of questions:

* ``capacity`` (the default): a request is admitted when the engine's KV pool can hold it beside
  what every in-flight request will hold over its lifetime, block-exactly
  (:mod:`sidecar.admission.capacity` answers ``fits``). Long requests run as many at once as fit.
  Under sustained pressure (the live gauge at or above 0.85 for the window) the admitted
  concurrency is lowered one step per window (the seeds' "lower ``max_num_seqs`` one step and let
  requests queue"), until usage falls under the release threshold.
* ``lanes``: the seeds' gateway rule without capacity accounting: at most
  ``long_lane_concurrency`` long prompts at once; the rest queue. It is also what ``capacity``
  falls back to while no pool is known (no ``cache_config_info`` and no prediction).
* ``token-budget``: every in-flight request reserves prompt + its bound in tokens against the pool.

The questions, in order:

1. **The engine would refuse it** (:mod:`sidecar.admission.parity`) -> 400, before any waiting.
2. **Draining** -> 503 ``draining``.
3. **Pressure** (the detector's effective state is ``PRESSURE``): long requests queue
   (``--on-pressure queue``) or are refused with 429 ``kv-pressure`` (``reject``).
4. **Behind others**: if the request's lane already has a queue, it queues (no overtaking in a lane);
   under ``capacity`` a short request also queues while the long lane's head has waited
   ``long_wait_priority`` seconds (ageing: nothing starves).
5. The policy's own question: ``capacity``: the pressure concurrency cap, the engine's sequence
   limit (``max_num_seqs``: beyond it vLLM would only queue the request itself, first come first
   served), then ``fits``;
   ``token-budget``: the token reservation; ``lanes``: the long-lane cap.
6. Otherwise: admit.

A "queue" decision becomes 429 ``queue-full`` when the lane's queue has no room. Lanes split at
``long_prompt_tokens`` (default: half of ``max_model_len``, else 16,384: the seeds' "16K of 32K").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.admission.outcomes import Lane, Reason

DEFAULT_LONG_PROMPT_TOKENS = 16_384


class AdmissionMode(StrEnum):
    """The admission policy (``--admission``)."""

    CAPACITY = "capacity"
    LANES = "lanes"
    TOKEN_BUDGET = "token-budget"  # noqa: S105 - a policy name, not a secret


class Action(StrEnum):
    """What to do with a request."""

    ADMIT = "admit"
    QUEUE = "queue"
    REFUSE = "refuse"


class OnPressure(StrEnum):
    """What the lanes policy does with a long prompt under pressure (``--on-pressure``)."""

    QUEUE = "queue"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """The admission flags."""

    long_prompt_tokens: int | None = None  # None: half of max_model_len, else 16384
    long_lane_concurrency: int = 1
    on_pressure: OnPressure = OnPressure.QUEUE
    mode: AdmissionMode = AdmissionMode.CAPACITY
    long_wait_priority: float = 10.0  # seconds a long head waits before shorts stop overtaking it

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", AdmissionMode(self.mode))  # a plain string is read as its member
        if self.on_pressure not in set(OnPressure):
            raise ValueError("on_pressure must be one of: " + ", ".join(OnPressure))
        object.__setattr__(self, "on_pressure", OnPressure(self.on_pressure))
        if self.long_lane_concurrency < 1:
            raise ValueError("the long lane needs a concurrency of at least 1")

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
    reserved_tokens: int = 0  # tokens reserved by in-flight requests (token-budget)
    policy: AdmissionMode = AdmissionMode.LANES  # the policy in effect (capacity falls back to lanes)
    fits: bool = True  # capacity: the ledger's answer
    inflight: int = 0
    concurrency_cap: int | None = None  # capacity under pressure
    yield_to_long: bool = False  # capacity: the long lane's head has waited long enough to go first
    sequence_room: bool = True  # capacity: below the engine's sequence limit (max_num_seqs)


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """The request as admission sees it."""

    prompt_tokens: int
    reserved_tokens: int  # token-budget: peak KV tokens over all sequences
    refusal: Reason | None = None  # set when the engine would refuse it (see sidecar.admission.parity)


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict: an action, the lane and the reason."""

    action: Action
    lane: Lane
    reason: Reason


def lane_of(prompt_tokens: int, config: AdmissionConfig, max_model_len: int | None) -> Lane:
    """The lane a prompt of ``prompt_tokens`` travels in."""
    return Lane.LONG if prompt_tokens >= config.long_threshold(max_model_len) else Lane.SHORT


def _policy_says_wait(
    request: AdmissionRequest, view: AdmissionView, config: AdmissionConfig, lane: Lane
) -> bool:
    if view.policy is AdmissionMode.CAPACITY:
        if view.concurrency_cap is not None and view.inflight >= view.concurrency_cap:
            return True
        return not view.sequence_room or not view.fits
    if view.policy is AdmissionMode.TOKEN_BUDGET:
        return (
            view.pool_tokens is not None
            and view.reserved_tokens > 0
            and view.reserved_tokens + request.reserved_tokens > view.pool_tokens
        )
    return lane is Lane.LONG and view.long_inflight >= config.long_lane_concurrency


def decide(request: AdmissionRequest, view: AdmissionView, config: AdmissionConfig) -> Decision:
    """Admit, queue or refuse; see the module docstring for the order of the questions."""
    lane = lane_of(request.prompt_tokens, config, view.max_model_len)
    if request.refusal is not None:
        return Decision(Action.REFUSE, lane, request.refusal)
    if view.draining:
        return Decision(Action.REFUSE, lane, Reason.DRAINING)
    if view.pressure and lane is Lane.LONG:
        if config.on_pressure is OnPressure.REJECT:
            return Decision(Action.REFUSE, lane, Reason.KV_PRESSURE)
        return _queue(view, lane)
    if view.queued_in_lane > 0 or view.yield_to_long or _policy_says_wait(request, view, config, lane):
        return _queue(view, lane)
    return Decision(Action.ADMIT, lane, Reason.ADMITTED)


def _queue(view: AdmissionView, lane: Lane) -> Decision:
    if view.queue_has_room:
        return Decision(Action.QUEUE, lane, Reason.QUEUED)
    return Decision(Action.REFUSE, lane, Reason.QUEUE_FULL)
