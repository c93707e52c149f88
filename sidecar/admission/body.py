"""What admission needs from an OpenAI-style request body, read once, coerced as vLLM coerces it.

``/v1/completions``: ``prompt`` is a string, a list of strings, a list of token ids or a list of
lists; every item of a batch is its own prompt (vLLM checks and schedules each separately); output
is ``max_tokens``, default 16. ``/v1/chat/completions``: the messages rendered through the model's
own chat template when the counter can (exact), else every message's text plus
:data:`CHAT_MESSAGE_OVERHEAD` template tokens (an estimate); output is ``max_completion_tokens``,
else ``max_tokens``, else ``None`` ("up to the context length", vLLM's default). ``/v1/responses``:
``input`` like a chat (the fields vLLM derives from it: ``as_rendered``), output ``max_output_tokens``.

Numbers and booleans are coerced the way vLLM's pydantic request models coerce them in lax mode
(``"8"``, ``8.0`` and ``true`` are the integer 8, 8 and 1; ``2.5`` and ``"abc"`` are refused),
which ``tests/unit/test_body_parity.py`` checks against pydantic itself. ``n`` is the number of
sequences per prompt (``best_of`` no longer exists in vLLM 0.32: like any unknown field it is
ignored, so it is ignored here too). Every problem is one :class:`RefusedError` naming it; values vLLM
would refuse for its own reasons are left to vLLM unless :mod:`sidecar.admission.parity` says so.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sidecar.admission.anthropic import MESSAGES_ROUTE, chat_messages
from sidecar.admission.conversation import as_rendered, content_texts, template_kwargs
from sidecar.admission.outcomes import Reason, RefusedError
from sidecar.admission.responses_input import responses_prompt
from sidecar.admission.tokens import TokenCounter, media_parts

T = TypeVar("T")

CHAT_MESSAGE_OVERHEAD = 8
"""Estimated template tokens per chat message when the template cannot be rendered (ChatML uses 5)."""
BATCH_CHAT_SUFFIX = "/chat/completions/batch"
"""vLLM 0.32's batch route: ``messages`` is a list of conversations, each a prompt of its own."""
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""vLLM's ``CompletionRequest.max_tokens`` default."""
MAX_PROMPT_ITEMS, _PYDANTIC_MAX_INT_DIGITS = 100_000, 4300


class _NotCoercibleError(ValueError):
    pass


_SPACE = (  # Unicode White_Space, what pydantic-core (Rust's str::trim) strips; Python's strip adds \x1c-\x1f
    " \t\n\x0b\x0c\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_INTEGER_TEXT = re.compile(r"[+-]?(?:0[0_]*(?:(?<=0)|[1-9](?:_?[0-9])*)|[1-9](?:_?[0-9])*)(?:\.0+)?\Z")
"""Digits with single underscores between them, as Python reads them, except that pydantic-core first strips
a leading run of zeros and underscores: ``"0__0"`` is 0 and ``"0__1_2"`` is 12, ``"0_"`` and ``"1__2"`` are
refused (pydantic 2.14.4, the version vLLM 0.32.0's environment here has)."""


def coerce_int(value: Any) -> int:
    """``value`` as pydantic's lax ``int`` reads it (bool, integral float, numeric string), else an error."""
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer() or abs(value) >= 2**63:
            raise _NotCoercibleError
        return int(value)
    if isinstance(value, str):
        text = value.strip(_SPACE)
        if len(text) > _PYDANTIC_MAX_INT_DIGITS or not _INTEGER_TEXT.match(text):
            raise _NotCoercibleError
        return int(text.split(".", 1)[0].replace("_", ""), 10)
    raise _NotCoercibleError


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def coerce_bool(value: Any) -> bool:
    """``value`` as pydantic's lax ``bool`` reads it (0/1, ``"yes"``/``"off"``...), else an error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise _NotCoercibleError


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """Everything admission decides on, read from one generation request (body and headers) in one pass."""

    prompts: tuple[int, ...]  # tokens of each prompt (a batch has several)
    max_output_tokens: int | None  # the client's bound per sequence; None: up to the context length
    exact: bool  # prompt counts are exact (token ids, or the model's tokenizer and template)
    choices: int = 1  # sequences per prompt (n)
    min_output_tokens: int = 0
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens
    stream: bool = False
    priority: int | None = None  # the priority header, else the body's ``priority``; None: 0
    tenant: str = ""  # who sent it (the tenant header, else the client address): tenants take turns
    wait_limit: float | None = None  # the client's queue-timeout header; None: the configured limit
    model: str = ""
    route: str = ""
    prompt_ids: tuple[tuple[int, ...], ...] | None = None  # each prompt's token ids, when known
    truncate_prompt_tokens: int | None = None  # vLLM truncates the prompt to this many (-1: max_model_len)
    stream_interval: int = 1  # vLLM's per-request ``stream_interval`` (chat, completions): tokens per event
    media_items: int = 0  # a chat's images, audio, video; prompt_embeds: their tokens are not in ``prompts``
    cache_salt: str | None = None  # vLLM keys prefix-cache blocks by it: only equal salts share blocks
    engine_counted: bool = False  # every prompt the sidecar would refuse was counted by vLLM (recount.py)

    @property
    def prompt_tokens(self) -> int:
        """The largest prompt of the request (the lane is chosen by it)."""
        return max(self.prompts, default=0)

    @property
    def sequences(self) -> int:
        """Sequences the engine will run: prompts x choices."""
        return len(self.prompts) * self.choices


def _invalid(message: str, param: str | None = None) -> RefusedError:
    return RefusedError(Reason.INVALID_REQUEST, message, param=param)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)  # a bool is no token id


def _prompts(
    prompt: Any, counter: TokenCounter, *, special: bool = True
) -> tuple[list[int], list[tuple[int, ...]] | None, bool]:
    """Per prompt: token counts, token ids when known, and whether the counts are exact.

    Text is tokenized with the tokenizer's special tokens unless ``special`` is off (vLLM's completions
    default ``add_special_tokens`` to true: a Llama-3 prompt gains its ``<|begin_of_text|>``); token ids are
    taken as they are.
    """
    if isinstance(prompt, str) or _is_ids(prompt):
        items: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt:
        if len(prompt) > MAX_PROMPT_ITEMS:
            raise _invalid(f"'prompt' has more than {MAX_PROMPT_ITEMS} items", "prompt")
        items = prompt
    else:
        raise _invalid("'prompt' must be a string, a list of strings or a list of token ids", "prompt")
    counts: list[int] = []
    ids: list[tuple[int, ...]] | None = []
    exact = True
    for item in items:
        if isinstance(item, str):
            tokens = counter.tokens(item, special=special)
            if tokens is None or not counter.exact:  # vLLM may tokenize text with another tokenizer
                counts.append(counter.count(item) if tokens is None else len(tokens))
                ids, exact = None, False
            else:
                counts.append(len(tokens))
                ids = None if ids is None else [*ids, tuple(tokens)]
        elif _is_ids(item):
            counts.append(len(item))
            ids = None if ids is None else [*ids, tuple(item)]
        else:
            raise _invalid("'prompt' must be a string, a list of strings or a list of token ids", "prompt")
    return counts, ids, exact


def _chat_prompts(
    body: dict[str, Any], conversations: list[list[dict[str, Any]]], counter: TokenCounter
) -> tuple[list[int], list[tuple[int, ...]] | None, bool, int]:
    """Each conversation's prompt (one, or the batch route's several), exact only without media."""
    counts: list[int] = []
    ids: list[tuple[int, ...]] | None = []
    exact, media = True, 0
    for messages in conversations:
        count, rendered, exact_one = _chat_prompt(body, messages, counter)
        items = sum(media_parts(message.get("content")) for message in messages)
        counts.append(count)
        media, exact = media + items, exact and exact_one and not items  # the planner adds the media's
        ids = None if ids is None or rendered is None or items else [*ids, rendered]
    return counts, ids, exact, media


def _chat_request(
    path: str, body: dict[str, Any], counter: TokenCounter
) -> tuple[list[int], list[tuple[int, ...]] | None, bool, int]:
    """A chat, a batch of chats or a Responses request: its prompts as vLLM builds their messages.

    A Responses request's: :mod:`~sidecar.admission.responses_input`; a stored conversation it continues
    (``previous_response_id``, ``previous_input_messages``) is one unseen item, learned from usage.
    """
    param = "input" if path.endswith("/responses") else "messages"
    if param not in body:
        raise _invalid(f"'{param}' is required", param)
    conversations = body[param] if path.endswith(BATCH_CHAT_SUFFIX) else [body[param]]
    if not isinstance(conversations, list) or not conversations:  # the batch route's: one per prompt
        raise _invalid(f"'{param}' must be a non-empty list of conversations", param)
    chats, known = [_messages(c, param) for c in conversations], True
    if param == "input":
        messages, known = responses_prompt(body, chats[0])
        chats = [messages]
    counts, ids, exact, media = _chat_prompts(body, chats, counter)
    if param == "input" and (body.get("previous_response_id") or body.get("previous_input_messages")):
        return counts, None, False, media + 1
    return (counts, ids, exact, media) if known else (counts, None, False, media)


def _anthropic_prompt(
    body: dict[str, Any], counter: TokenCounter
) -> tuple[list[int], list[tuple[int, ...]] | None, int]:
    """An Anthropic request's prompt: rendered as vLLM converts it (:mod:`sidecar.admission.anthropic`)."""
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise _invalid("'messages' must be a non-empty list of messages", "messages")
    messages, tools, media = chat_messages(body)
    kwargs = body.get("chat_template_kwargs")
    rendered = (
        None
        if media
        else counter.chat_tokens(messages, tools=tools, extra=kwargs if isinstance(kwargs, dict) else None)
    )
    if rendered is not None:
        return [len(rendered)], [tuple(rendered)], 0
    return [sum(counter.count(m["content"]) + CHAT_MESSAGE_OVERHEAD for m in messages)], None, media


def _completion_prompts(
    body: dict[str, Any], counter: TokenCounter
) -> tuple[list[int], list[tuple[int, ...]] | None, bool, int]:
    """A completion's prompts as vLLM 0.32 builds them (``preprocess_completion``, ``online_renderer.py``).

    Its ``prompt_embeds`` (with ``--enable-prompt-embeds``) come first, a prompt each, whose lengths only
    the engine knows: counted 0 here, with as many items for the planner to add (``MediaTokens``); a
    ``prompt`` may then be left out. A ``suffix`` (fill-in-the-middle) is rendered into each text prompt
    with the model's FIM tokens: its text is added, and the count is no longer exact.
    """
    embeds = body.get("prompt_embeds")
    embedded = len(embeds) if isinstance(embeds, list) else int(embeds not in (None, ""))
    if embedded and body.get("prompt") in (None, ""):
        return [0] * embedded, None, False, embedded
    if "prompt" not in body:
        raise _invalid("'prompt' is required", "prompt")
    special = _optional(body, "add_special_tokens", coerce_bool, "a boolean")  # vLLM's default: true
    counts, ids, exact = _prompts(body["prompt"], counter, special=special is not False)
    if isinstance(suffix := body.get("suffix"), str) and suffix:
        counts, ids, exact = [count + counter.count(suffix) for count in counts], None, False
    if embedded:
        return [0] * embedded + counts, None, False, embedded
    return counts, ids, exact, 0


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(content_texts(content))
    raise _invalid("a message's 'content' must be a string or a list of parts", "messages")


def _messages(messages: Any, param: str) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if not isinstance(messages, list) or not messages:
        raise _invalid(f"'{param}' must be a non-empty list of messages", param)
    if len(messages) > MAX_PROMPT_ITEMS:
        raise _invalid(f"'{param}' has more than {MAX_PROMPT_ITEMS} messages", param)
    for message in messages:
        if not isinstance(message, dict):
            raise _invalid(f"every item of '{param}' must be an object with 'role' and 'content'", param)
        _content_text(message.get("content"))
    return messages


def _chat_prompt(
    body: dict[str, Any], messages: list[dict[str, Any]], counter: TokenCounter
) -> tuple[int, tuple[int, ...] | None, bool]:
    """Rendered through the model's template (exact), else text plus the per-message overhead."""
    if body.get("chat_template") is None:  # a request's own template: vLLM needs a flag to trust it
        rendered = counter.chat_tokens(
            messages,
            tools=body.get("tools"),
            tool_choice=body.get("tool_choice"),
            add_generation_prompt=body.get("add_generation_prompt", True) is not False,
            extra=template_kwargs(body),
            special=_optional_bool(body, "add_special_tokens"),  # vLLM's chat default: false
        )
        if rendered is not None:
            return len(rendered), tuple(rendered), counter.chats_exact
    total = sum(counter.count(_content_text(m.get("content"))) + CHAT_MESSAGE_OVERHEAD for m in messages)
    if isinstance(tools := body.get("tools"), list) and tools:  # the template prints them, near their JSON
        total += counter.count(json.dumps(tools, ensure_ascii=False))
    return total, None, False


def _optional(body: dict[str, Any], key: str, coerce: Callable[[Any], T], kind: str) -> T | None:
    value = body.get(key)
    if value is None:
        return None
    try:
        return coerce(value)
    except _NotCoercibleError:
        raise _invalid(f"'{key}' must be {kind}", key) from None


def _optional_int(body: dict[str, Any], key: str) -> int | None:
    return _optional(body, key, coerce_int, "an integer")


def _optional_bool(body: dict[str, Any], key: str) -> bool:
    return _optional(body, key, coerce_bool, "a boolean") or False


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


def request_facts(
    path: str,
    body: dict[str, Any],
    counter: TokenCounter,
    *,
    tenant: str = "",
    priority: int | None = None,
    wait_limit: float | None = None,
    effort_map: Mapping[str, str] | None = None,
) -> RequestFacts:
    """The admission facts of a decoded generation request to ``path``.

    ``tenant``, ``priority`` (the header's, which wins over the body's) and ``wait_limit`` come from the
    request's headers: given here, the facts are built once. ``effort_map``: ``--reasoning-effort-map``'s.
    """
    ids: list[tuple[int, ...]] | None
    media, openai = 0, not path.endswith(MESSAGES_ROUTE)  # Anthropic's API has no n, priority, ignore_eos ...
    if not openai:
        counts, ids, media = _anthropic_prompt(body, counter)
        exact, output = False, _optional_int(body, "max_tokens")  # a near count: never a 400 (anthropic.py)
    elif path.endswith(("/chat/completions", BATCH_CHAT_SUFFIX, "/responses")):
        counts, ids, exact, media = _chat_request(path, as_rendered(path, body, effort_map or {}), counter)
        if path.endswith("/responses"):
            output = _optional_int(body, "max_output_tokens")
        else:
            completion = _optional_int(body, "max_completion_tokens")
            output = completion if completion is not None else _optional_int(body, "max_tokens")
    else:
        counts, ids, exact, media = _completion_prompts(body, counter)
        given = _optional_int(body, "max_tokens")
        output = given if given is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    if not openai:  # the fields below are not the Anthropic request's: vLLM ignores them there
        body = {k: v for k, v in body.items() if k in ("model", "stream", "cache_salt")}
    choices = max(1, _optional_int(body, "n") or 1)  # best_of is gone in vLLM 0.32: an unknown field, ignored
    body_priority = _optional_int(body, "priority")
    truncate = _optional_int(body, "truncate_prompt_tokens")
    if path.endswith("/responses") and body.get("truncation", "disabled") != "disabled":
        truncate = -1  # vLLM truncates the input instead (ResponsesRequest.build_tok_params): "auto", null
    interval = None if path.endswith("/responses") else _optional_int(body, "stream_interval")
    if truncate is not None and truncate > 0:
        counts = [min(count, truncate) for count in counts]
        if ids is not None:
            ids = [prompt[-truncate:] for prompt in ids]  # vLLM keeps the end (truncation side "left")
    model = body.get("model")
    return RequestFacts(
        prompts=tuple(counts),
        max_output_tokens=output,
        exact=exact,
        choices=choices,
        min_output_tokens=max(0, _optional_int(body, "min_tokens") or 0),
        ignore_eos=_optional_bool(body, "ignore_eos"),
        stream=_optional_bool(body, "stream"),
        priority=body_priority if priority is None else priority,
        tenant=tenant,
        wait_limit=wait_limit,
        model=model if isinstance(model, str) else "",
        route=path,
        prompt_ids=None if ids is None else tuple(ids),
        truncate_prompt_tokens=truncate,
        stream_interval=max(1, interval or 1),
        media_items=media,
        cache_salt=salt if isinstance(salt := body.get("cache_salt"), str) else None,
    )
