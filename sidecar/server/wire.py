"""The wire between clients, the sidecar and vLLM: headers, error bodies, tenants, answer lengths.

Pure helpers of :mod:`sidecar.server.proxy`, apart so each can be read (and tested) alone. Hop-by-hop
headers (RFC 9110 section 7.6.1, and any a ``Connection`` header lists) are never forwarded; the client's
address is appended to ``X-Forwarded-For``. An error body is OpenAI's shape, so clients' SDKs read it,
with ``X-KV-Sidecar-Reason`` naming the reason and ``Retry-After`` where a retry can succeed.
"""

from __future__ import annotations

import hashlib
import re

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from sidecar.admission.anthropic import MESSAGES_ROUTE
from sidecar.admission.outcomes import AdmissionError
from sidecar.admission.tickets import Ticket

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that describe one connection, never forwarded."""


def error_response(error: AdmissionError, route: str = "") -> web.Response:
    """The error body with ``X-KV-Sidecar-Reason`` and, where it applies, ``Retry-After``.

    OpenAI's shape, or on the Anthropic route the shape vLLM answers there (``{"type": "error", "error":
    {"type", "message"}}``, ``vllm/entrypoints/anthropic/api_router.py``), which Anthropic's clients read.
    """
    reason = error.reason
    headers = {"X-KV-Sidecar-Reason": reason.value}
    if error.retry_after is not None:
        headers["Retry-After"] = str(int(error.retry_after))
    if route == MESSAGES_ROUTE:
        anthropic = {"type": "error", "error": {"type": reason.error_type, "message": error.message}}
        return web.json_response(anthropic, status=reason.status, headers=headers)
    body = {
        "error": {
            "message": error.message,
            "type": reason.error_type,
            "param": error.param,
            "code": reason.value,
        }
    }
    return web.json_response(body, status=reason.status, headers=headers)


_NOT_FOR_VLLM = HOP_BY_HOP | {"host", "content-length"}  # aiohttp's client writes its own
_NOT_FOR_WHOLE_ANSWERS = HOP_BY_HOP | {"content-length"}  # web.Response sets it from the body


def _dropped(headers: CIMultiDictProxy[str], always: frozenset[str]) -> frozenset[str]:
    """``always`` plus the headers the ``Connection`` header lists (hop-by-hop by RFC 9110 section 7.6.1)."""
    connection = headers.get("Connection")
    if not connection:
        return always
    return always | {h.strip().lower() for h in connection.split(",") if h.strip()}


def forward_headers(headers: CIMultiDictProxy[str], peer: str | None) -> CIMultiDict[str]:
    """The request's headers for vLLM: no hop-by-hop ones, no Host or Content-Length, the peer appended."""
    drop = _dropped(headers, _NOT_FOR_VLLM)
    out = CIMultiDict([(name, value) for name, value in headers.items() if name.lower() not in drop])
    if peer:
        prior = headers.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    return out


def response_headers(headers: CIMultiDictProxy[str], *, whole: bool = False) -> CIMultiDict[str]:
    """VLLM's response headers for the client, without hop-by-hop ones (``whole``: nor Content-Length)."""
    drop = _dropped(headers, _NOT_FOR_WHOLE_ANSWERS if whole else HOP_BY_HOP)
    return CIMultiDict([(name, value) for name, value in headers.items() if name.lower() not in drop])


def tenant_of(request: web.Request, header: str) -> str:
    """The tenant: the configured header, else a hash of the API key (never the key), else ``anonymous``."""
    if value := request.headers.get(header):
        return value[:128]
    if auth := request.headers.get("Authorization"):
        return "key-" + hashlib.sha256(auth.encode()).hexdigest()[:12]
    return "anonymous"


_COMPLETION_TOKENS = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')  # output_: Responses API
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
EVENT_CLOCK_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions"})
"""Routes whose streams send one ``data:`` event per engine step and choice (the Responses and Anthropic
streams add lifecycle events: ``response.created``, ``message_start`` and others, so theirs are not steps)."""
_TAIL_BYTES = 4096


class AnswerLength:
    """How long an answer is: its usage, else its streamed events counted where they are steps.

    Usage says ``completion_tokens``, or ``output_tokens`` on the Responses and Anthropic routes; events are
    steps on :data:`EVENT_CLOCK_ROUTES` only.
    vLLM streams one ``data:`` event per engine step and choice (``stream_interval`` 1), closed by
    ``data: [DONE]``: a token each, or up to ``k + 1`` with ``k`` speculative tokens, and several steps'
    tokens when its reader lags (``RequestOutputCollector.put``; not seen here with 8 streams on 2 cores).
    So counted events may be fewer than the tokens: where the engine speculates, or holds events back for a
    ``stream_interval`` above 1 (the request's or vLLM's ``--stream-interval``), the planner learns nothing
    from them. A JSON answer carries ``usage`` near its end. Only the last few KiB are kept.
    """

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self.stream = ticket.stream and ticket.route in EVENT_CLOCK_ROUTES  # a step clock only there
        self.events = 0
        self._tail = b""
        self.usage_seen = False

    def feed(self, chunk: bytes) -> int | None:
        """Take one chunk; for a stream, the events per sequence so far."""
        joined = self._tail + chunk
        seam = max(0, len(self._tail) - 4)  # a ``data:`` split between two chunks is counted once
        self._tail = joined[-_TAIL_BYTES:]
        if not self.stream:
            return None
        self.events += joined.count(b"data:", seam)
        return self.events // max(1, self.ticket.sequences)

    def completion_tokens(self) -> int | None:
        """The answer's output tokens over all choices, or ``None`` when unknown."""
        found = _COMPLETION_TOKENS.findall(self._tail)
        if found:
            self.usage_seen = True
            return int(found[-1])
        if self.stream and self.events:
            return max(0, self.events - 1)  # less the closing [DONE]
        return None

    def prompt_tokens(self) -> int | None:
        """The answer's prompt tokens from its usage (media expanded into tokens), or ``None`` without it."""
        found = _PROMPT_TOKENS.findall(self._tail)
        return int(found[-1]) if found else None
