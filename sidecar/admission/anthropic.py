"""The Anthropic Messages API (``POST /v1/messages``) as vLLM 0.32 serves it, as admission counts it. Pure.

vLLM 0.32.0 serves Anthropic's API by converting each request into a chat completion
(``AnthropicServingMessages.to_chat_completion_request``, ``vllm/entrypoints/anthropic/serving.py``) that
its chat template renders: ``system`` (a string, or text blocks joined with ``""``) becomes a leading system
message; each message's text blocks its content; ``image`` blocks media; ``tool_use`` blocks tool calls whose
arguments are the input's JSON; ``tool_result`` blocks tool messages; ``thinking`` blocks reasoning text;
``tools`` OpenAI functions (``name``, ``description``, ``input_schema`` as ``parameters``); ``max_tokens``
(required) the output bound. The conversion also merges inline system messages when the template wants the
system first, strips Claude Code's billing header and passes thinking settings to the template, so a count
rendered from this conversion is near vLLM's but not exact: it never causes a 400
(:mod:`sidecar.admission.parity`), and its token ids serve only to find prompt blocks two requests share.
The answer's ``usage`` says ``input_tokens`` and ``output_tokens``; streams add lifecycle events
(``message_start`` ...), so their events are no step clock (:mod:`sidecar.server.wire`).
"""

from __future__ import annotations

import json
from typing import Any

MESSAGES_ROUTE = "/v1/messages"
MEDIA_BLOCKS = frozenset({"image", "document"})


def _blocks(content: Any) -> tuple[list[str], int]:
    """A message's text as the template sees it (tool blocks as their JSON), and its media blocks."""
    if content is None:
        return [], 0
    if isinstance(content, str):
        return [content], 0
    texts, media = [], 0
    for block in content if isinstance(content, list) else [content]:
        if not isinstance(block, dict):
            texts.append(str(block))
        elif str(block.get("type")) in MEDIA_BLOCKS:  # a client's type may be any JSON value
            media += 1
        elif isinstance(text := block.get("text", block.get("thinking")), str):
            texts.append(text)
        else:  # tool_use, tool_result and the rest: their fields' text, as near as an estimate gets
            texts.append(json.dumps({k: v for k, v in block.items() if k not in ("type", "id", "signature")}))
    return texts, media


def chat_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any] | None, int]:
    """The request as the chat vLLM renders: messages, tools (OpenAI functions) and media blocks."""
    system, media = _blocks(body.get("system"))
    messages: list[dict[str, Any]] = [{"role": "system", "content": "".join(system)}] if system else []
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        texts, items = _blocks(message.get("content"))
        media += items
        messages.append({"role": str(message.get("role", "user")), "content": "\n".join(texts)})
    given = body.get("tools")
    tools = [
        {
            "type": "function",
            "function": {
                "name": tool.get("name", ""),
                "description": tool.get("description"),
                "parameters": tool.get("input_schema"),
            },
        }
        for tool in (given if isinstance(given, list) else [])
        if isinstance(tool, dict)
    ]
    return messages, tools or None, media
