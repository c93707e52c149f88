"""What admission needs from an OpenAI-style request body: prompt and output token counts.

``/v1/completions``: ``prompt`` is a string, a list of strings, a list of token ids or a list of
lists; ``max_tokens`` defaults to 16 (vLLM's default). ``/v1/chat/completions``: every message's
content (a string or a list of parts; text parts are counted) plus :data:`CHAT_MESSAGE_OVERHEAD`
tokens per message for the chat template; output is ``max_completion_tokens``, else ``max_tokens``,
else ``None`` ("up to the context length", vLLM's default). ``/v1/responses``: ``input`` like a chat.
``n`` multiplies the output (not the prompt, which the choices share). Every problem is one
:class:`RefusedError` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sidecar.admission.outcomes import Reason, RefusedError
from sidecar.admission.tokens import TokenCounter

CHAT_MESSAGE_OVERHEAD = 8
"""Template tokens per chat message (role markers and separators; Qwen's ChatML uses about 5)."""
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MAX_PROMPT_ITEMS = 100_000


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """The parts of a generation request that admission decides on."""

    prompt_tokens: int
    output_tokens: int | None  # per choice; None: up to the context length
    exact: bool
    stream: bool = False
    priority: int | None = None
    choices: int = 1

    def sequence_tokens(self, max_model_len: int | None) -> int:
        """Tokens one sequence may reach: prompt plus output (open-ended output: up to ``max_model_len``)."""
        if self.output_tokens is not None:
            return self.prompt_tokens + self.output_tokens
        return max(self.prompt_tokens, max_model_len or self.prompt_tokens)

    def reserved_tokens(self, max_model_len: int | None) -> int:
        """KV tokens the request may hold at its peak: the prompt once, each choice's output."""
        return self.prompt_tokens + (self.sequence_tokens(max_model_len) - self.prompt_tokens) * self.choices


def _invalid(message: str, param: str | None = None) -> RefusedError:
    return RefusedError(Reason.INVALID_REQUEST, message, param=param)


def _count_prompt(prompt: Any, counter: TokenCounter) -> tuple[int, bool]:
    if isinstance(prompt, str):
        return counter.count(prompt), counter.exact
    if isinstance(prompt, list):
        if len(prompt) > MAX_PROMPT_ITEMS:
            raise _invalid(f"'prompt' has more than {MAX_PROMPT_ITEMS} items", "prompt")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return len(prompt), True
        total, exact = 0, True
        for item in prompt:
            if isinstance(item, str):
                total, exact = total + counter.count(item), exact and counter.exact
            elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                total += len(item)
            else:
                raise _invalid(
                    "'prompt' must be a string, a list of strings or a list of token ids", "prompt"
                )
        return total, exact
    raise _invalid("'prompt' must be a string, a list of strings or a list of token ids", "prompt")


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    raise _invalid("a message's 'content' must be a string or a list of parts", "messages")


def _count_messages(messages: Any, counter: TokenCounter, param: str) -> int:
    if isinstance(messages, str):
        return counter.count(messages) + CHAT_MESSAGE_OVERHEAD
    if not isinstance(messages, list) or not messages:
        raise _invalid(f"'{param}' must be a non-empty list of messages", param)
    if len(messages) > MAX_PROMPT_ITEMS:
        raise _invalid(f"'{param}' has more than {MAX_PROMPT_ITEMS} messages", param)
    total = 0
    for message in messages:
        if not isinstance(message, dict):
            raise _invalid(f"every item of '{param}' must be an object with 'role' and 'content'", param)
        total += counter.count(_content_text(message.get("content"))) + CHAT_MESSAGE_OVERHEAD
    return total


def _optional_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _invalid(f"'{key}' must be a non-negative integer", key)
    return value


def decode_json_body(raw: bytes) -> dict[str, Any]:
    """Decode a request body as a JSON object, or raise one :class:`RefusedError` naming the problem."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(
            f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise _invalid("the request body nests JSON too deeply") from None
    if not isinstance(body, dict):
        raise _invalid("the request body must be a JSON object")
    return body


def request_facts(path: str, body: dict[str, Any], counter: TokenCounter) -> RequestFacts:
    """The admission facts of a decoded generation request to ``path``."""
    if path.endswith("/chat/completions"):
        if "messages" not in body:
            raise _invalid("'messages' is required", "messages")
        prompt, exact = _count_messages(body["messages"], counter, "messages"), counter.exact
        output = _optional_int(body, "max_completion_tokens")
        if output is None:
            output = _optional_int(body, "max_tokens")
    elif path.endswith("/responses"):
        prompt, exact = _count_messages(body.get("input"), counter, "input"), counter.exact
        output = _optional_int(body, "max_output_tokens")
    else:
        if "prompt" not in body:
            raise _invalid("'prompt' is required", "prompt")
        prompt, exact = _count_prompt(body["prompt"], counter)
        output = _optional_int(body, "max_tokens")
        if output is None:
            output = COMPLETIONS_DEFAULT_MAX_TOKENS
    choices = _optional_int(body, "n") or 1
    priority = body.get("priority")
    return RequestFacts(
        prompt_tokens=prompt,
        output_tokens=output,
        choices=choices,
        exact=exact,
        stream=body.get("stream") is True,
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else None,
    )
