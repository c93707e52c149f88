"""The controller's records: queue limits, the ticket an admitted request holds, a waiting request."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sidecar.admission.body import RequestFacts
from sidecar.admission.count_audit import audited_prompt
from sidecar.admission.decide import AdmissionRequest
from sidecar.admission.outcomes import Lane, Reason


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Limits of each lane's queue."""

    max_entries: int = 1024
    max_tokens: int = 4_000_000
    timeout: float = 30.0

    def wait_limit(self, asked: float | None) -> float:
        """How long a request may wait: the client's own limit (``asked``) when it is shorter."""
        return self.timeout if asked is None else min(self.timeout, max(0.0, asked))


@dataclass(slots=True)
class Ticket:
    """An admitted request's hold on its lane and, under ``capacity``, on KV blocks."""

    lane: Lane
    reserved_tokens: int
    admitted_at: float
    waited: float = 0.0
    queued: bool = False
    released: bool = False
    holding: int | None = None  # the ledger's id
    sequences: int = 1
    prompts: tuple[int, ...] = ()
    route: str = ""
    model: str = ""
    stream: bool = False
    completion_tokens: int | None = None  # the answer's length, when the proxy could read it
    counted: bool = False  # completion_tokens counts a stream's events (no usage): one may hold more tokens
    stream_interval: int = 1  # the request's ``stream_interval``: vLLM streams an event per that many tokens
    teaches_output: bool = True  # False when the client fixed the answer's length (``ignore_eos``)
    media_items: int = 0  # images, audio, video, prompt embeddings (their tokens learned from ``usage``)
    prompt_usage: int | None = None  # the answer's ``usage.prompt_tokens``, when the proxy could read it
    audited_prompt: int | None = None  # the exact count the answer's usage checks (count_audit.py)

    @classmethod
    def of(
        cls, facts: RequestFacts, lane: Lane, reserved_tokens: int, now: float, *, waited: float,
        queued: bool, holding: int | None,
    ) -> Ticket:  # fmt: skip
        """The ticket of ``facts``, admitted at ``now`` into ``lane`` after ``waited`` seconds."""
        return cls(
            lane=lane, reserved_tokens=reserved_tokens, admitted_at=now, waited=waited, queued=queued,
            holding=holding, sequences=facts.sequences, prompts=facts.prompts, route=facts.route,
            model=facts.model, stream=facts.stream, teaches_output=not facts.ignore_eos,
            stream_interval=facts.stream_interval, media_items=facts.media_items,
            audited_prompt=audited_prompt(facts),
        )  # fmt: skip


@dataclass(slots=True)
class Waiter:
    """A request asking for admission: its facts, its decision inputs, its lane and, once queued, its future.

    ``future`` is set when the request joins a queue (most requests are admitted at once and never need one).
    """

    facts: RequestFacts
    request: AdmissionRequest
    lane: Lane
    enqueued_at: float
    hashes: tuple[tuple[int, ...], ...]
    future: asyncio.Future[Ticket] = field(init=False, repr=False, compare=False)  # unset until queued


def token_reservation(facts: RequestFacts, max_model_len: int | None) -> int:
    """token-budget: each prompt once, each of its choices up to its bound (or the context length)."""
    total = 0
    for prompt in facts.prompts:
        room = (max_model_len or prompt) - prompt
        output = room if facts.max_output_tokens is None else facts.max_output_tokens
        if max_model_len is not None:
            output = min(output, max(0, room))
        total += prompt + max(0, output) * facts.choices
    return total


def admission_request(
    facts: RequestFacts, max_model_len: int | None, refusal: Reason | None
) -> AdmissionRequest:
    """The request as ``decide`` sees it: its largest prompt, its token reservation, the engine's refusal."""
    return AdmissionRequest(facts.prompt_tokens, token_reservation(facts, max_model_len), refusal)
