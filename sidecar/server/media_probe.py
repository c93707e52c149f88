"""Asking vLLM what a chat's images, audio or video take, while admission has not learned it from usage.

vLLM 0.32.0 serves ``POST /tokenize`` (``vllm/entrypoints/serve/tokenize``): a chat body sent there is
rendered and its media processed as the chat's would be, expanded into their placeholder tokens; the answer's
``count`` is the prompt's length (a 112 x 112 image chat on the tiny Qwen2-VL: 53, the same as that chat's
``usage.prompt_tokens``). The request's own bytes are sent: vLLM ignores the generation fields there.
Admission learns each item's tokens from answers' usage (:class:`~sidecar.admission.outputs.MediaTokens`),
but a chat stream carries none unless the client asks for it, so until a route and model has
``trusted_samples`` of them a chat with media is counted this way first: one more request, whose media vLLM's
API process decodes a second time. Any failure (an older vLLM, an error, a timeout) leaves the request as it
was: planned at the whole context until usage says more. Only ``/v1/chat/completions``: ``/tokenize`` takes
neither the Responses input nor Anthropic's messages (whose streams carry usage).
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from sidecar.admission.body import RequestFacts
from sidecar.admission.outputs import MediaTokens
from sidecar.admission.recount import CHAT_ROUTE

PROBE_TIMEOUT_SECONDS = 2.0
"""The longest a request waits for vLLM's count; past it, it is admitted as if there were none."""


async def count_prompt(
    session: aiohttp.ClientSession, base: str, body: bytes, auth: str | None
) -> int | None:
    """The count vLLM's ``/tokenize`` gives ``body`` (a chat or a text prompt), or ``None`` without one."""
    headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth else {})}
    try:
        async with (
            asyncio.timeout(PROBE_TIMEOUT_SECONDS),
            session.post(base + "/tokenize", data=body, headers=headers) as response,
        ):
            answer = await response.json(content_type=None) if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    count = answer.get("count") if isinstance(answer, dict) else None
    return count if type(count) is int and count > 0 else None


async def teach_media_tokens(
    session: aiohttp.ClientSession | None, base: str, request: web.Request, body: bytes, *,
    facts: RequestFacts, media: MediaTokens,
) -> None:  # fmt: skip
    """Before admitting a chat with media, learn its items' tokens from vLLM's count while usage is scarce."""
    if session is None or facts.route != CHAT_ROUTE or not media.wants(facts):
        return
    if (count := await count_prompt(session, base, body, request.headers.get("Authorization"))) is not None:
        media.learn((facts.route, facts.model), facts.media_items, facts.prompt_tokens, count)
