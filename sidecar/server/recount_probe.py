"""Asking vLLM to count a prompt the sidecar would refuse as too long, before refusing it.

The rules (which prompts, what the ``/tokenize`` request carries, what its count decides) are
:mod:`sidecar.admission.recount`'s; this is the I/O around them: the request's body decoded again (off the
event loop when large), one ``/tokenize`` call per prompt to count (``media_probe.count_prompt``: the
client's credentials, a 2 s limit), the answers checked by the count audit. At most
:data:`RECOUNTS_IN_FLIGHT` run at once, so a flood of oversized prompts cannot keep vLLM's API process
tokenizing them; past that, and on any failure, a prompt is judged on the sidecar's count as before.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from sidecar.admission.body import RequestFacts, decode_json_body
from sidecar.admission.conversation import EngineChat
from sidecar.admission.count_audit import CountAudit
from sidecar.admission.outcomes import RefusedError
from sidecar.admission.recount import recounted, suspects, tokenize_bodies
from sidecar.server.media_probe import count_prompt
from sidecar.signals.kinds import EngineKind

if TYPE_CHECKING:
    from sidecar.monitor.monitor import Monitor

RECOUNTS_IN_FLIGHT = 4
"""Prompts being counted by vLLM at once; a prompt past this is judged on the sidecar's count."""
OFFLOAD_BYTES = 64 * 1024
"""Bodies from this size are decoded and encoded in a worker thread."""


class PromptRecounter:
    """vLLM's own count of each prompt the sidecar would refuse as too long (``POST /tokenize``)."""

    def __init__(self, chat: EngineChat, audit: CountAudit, monitor: Monitor) -> None:
        self.chat, self.audit, self.monitor = chat, audit, monitor
        self.in_flight = 0

    def max_model_len(self) -> int | None:
        """The context length while the engine is up and is vLLM (its ``/tokenize`` asked), else ``None``."""
        engine = self.monitor.engine
        vllm = engine.up and engine.snapshot is not None and engine.snapshot.kind is EngineKind.VLLM
        return self.monitor.request_max_model_len() if vllm else None

    def _bodies(self, route: str, body: bytes, indexes: tuple[int, ...]) -> dict[int, bytes] | None:
        try:
            decoded = decode_json_body(body)
        except RefusedError:
            return None
        asks: dict[int, dict[str, Any]] | None = tokenize_bodies(route, decoded, self.chat, indexes)
        return None if asks is None else {index: json.dumps(ask).encode() for index, ask in asks.items()}

    async def recount(
        self, session: aiohttp.ClientSession | None, base: str, request: web.Request, body: bytes,
        facts: RequestFacts, *, chats_exact: bool,
    ) -> RequestFacts:  # fmt: skip
        """``facts`` with vLLM's counts of the prompts it would refuse, or as they were when it gave none."""
        max_model_len = self.max_model_len()
        indexes = suspects(facts, max_model_len, chats_exact=chats_exact)
        if not indexes or session is None or max_model_len is None:
            return facts
        if self.in_flight >= RECOUNTS_IN_FLIGHT:
            self.audit.recounts["unanswered"] += 1
            return facts
        self.in_flight += 1
        try:
            if len(body) < OFFLOAD_BYTES:
                asks = self._bodies(facts.route, body, indexes)
            else:
                asks = await asyncio.to_thread(self._bodies, facts.route, body, indexes)
            if asks is None:
                return facts
            auth = request.headers.get("Authorization")
            answers = await asyncio.gather(*(count_prompt(session, base, ask, auth) for ask in asks.values()))
        finally:
            self.in_flight -= 1
        counts = {index: count for index, count in zip(asks, answers, strict=True) if count is not None}
        if len(counts) < len(asks):
            self.audit.recounts["unanswered"] += 1
            return facts
        if facts.exact:
            for index, count in counts.items():
                self.audit.record((facts.route, facts.model), facts.prompts[index], count)
        checked = recounted(facts, counts)
        refused = any(checked.prompts[index] >= max_model_len for index in indexes)
        self.audit.recounts["refused" if refused else "served"] += 1
        return checked
