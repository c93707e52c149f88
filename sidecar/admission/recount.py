"""Prompts the sidecar would refuse as too long, counted again by vLLM itself before it refuses. Pure.

Theory of operation
-------------------
The sidecar refuses a prompt of ``max_model_len`` tokens or more with vLLM's 400 before vLLM sees it
(:mod:`sidecar.admission.parity`), so that a request vLLM always refuses does not wait in the queue for room
first. Its count rests on the tokenizer and chat template it was given, and an answer's usage can only prove
that count wrong after the fact (:mod:`sidecar.admission.count_audit`): until the first answer, a sidecar
given another template than vLLM's refused chats that vLLM serves. So before refusing, the sidecar asks vLLM
to count the prompt: ``POST /tokenize`` (vLLM 0.32.0, ``vllm/entrypoints/serve/tokenize``, served by every
``vllm serve``, not only in development mode) renders a chat through the same ``preprocess_chat`` the chat
route uses (``renderers/online_renderer.py``: the server's ``--chat-template``, content format and
``--default-chat-template-kwargs``, the request's tools dumped by ``ChatCompletionToolsParam``) and tokenizes
a completion's text with the request's ``add_special_tokens`` as ``preprocess_completion`` does, without
the length check (``max_total_tokens=None``), and answers ``count``. The refusal then stands on vLLM's
count; when vLLM counts fewer than ``max_model_len`` the request is served with that count, and an exact
count of the sidecar's that vLLM contradicts ends its route's trust as an answer's usage would.

What the tokenize request carries (:func:`tokenize_bodies`), checked in 0.32.0's sources:

* a chat: its ``messages`` (a client's ``reasoning_content`` renamed ``reasoning``, as the chat route's
  ``_normalize_messages_before`` renames it and ``TokenizeChatRequest`` does not), ``tools`` (none when the
  chat route would render none: ``tool_choice`` ``"none"`` under ``--exclude-tools-when-tool-choice-none``,
  ``render_chat``), ``add_generation_prompt``, ``continue_final_message``, ``add_special_tokens``,
  ``chat_template``, ``mm_processor_kwargs`` and, as ``chat_template_kwargs``, the variables the chat route
  builds (``ChatCompletionRequest.build_chat_params`` adds ``documents``, ``reasoning_effort`` and
  ``enable_thinking``, which ``TokenizeChatRequest`` has no field for:
  :func:`~sidecar.admission.conversation.template_kwargs`); each conversation of the batch route on its own;
* a completion: each text prompt of the batch on its own, with ``add_special_tokens`` (vLLM's default true);
* a Responses request: as the chat its route renders (``render_responses``, ``online_renderer.py``): the
  messages, tools and variables it builds (:mod:`sidecar.admission.responses_input`), and
  ``add_special_tokens`` true, as that route tokenizes; not one continuing a stored conversation
  (``previous_response_id``), whose stored part is not in the body.

Not asked, so judged as before (the sidecar's count, trusted until an answer disagrees): token-id prompts
(their length is vLLM's), prompts vLLM truncates (``truncate_prompt_tokens``, the Responses route's
``truncation``), chats with media (vLLM would fetch and process them again), a completion's ``suffix`` or
``prompt_embeds``, the Anthropic route (``/tokenize`` does not take it), and a chat the sidecar
cannot render as vLLM does (no tokenizer or template, or gpt-oss, which vLLM renders with Harmony, not the
template ``/tokenize`` renders). Only Kimi K3's renderer reads ``tool_choice`` and ``response_format``
(``renderers/kimi_k3.py``), which ``/tokenize`` lacks: its count can only come out lower than the chat
route's, so vLLM, not the sidecar, refuses what it cannot serve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sidecar.admission.body import BATCH_CHAT_SUFFIX, RequestFacts
from sidecar.admission.conversation import EngineChat, as_rendered, reasoning_renamed, template_kwargs
from sidecar.admission.responses_input import responses_prompt

CHAT_ROUTE = "/v1/chat/completions"
RESPONSES_ROUTE = "/v1/responses"
COMPLETIONS_ROUTE = "/v1/completions"
CHAT_FIELDS = (
    "model", "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
    "mm_processor_kwargs",
)  # fmt: skip
"""A chat's fields that ``TokenizeChatRequest`` has under the same name and meaning."""


def suspects(facts: RequestFacts, max_model_len: int | None, *, chats_exact: bool) -> tuple[int, ...]:
    """The prompts of ``facts`` the sidecar would refuse as too long and vLLM can count: their indexes.

    ``chats_exact``: whether the sidecar renders chats as vLLM's chat route does (its counter's flag).
    """
    if max_model_len is None or facts.truncate_prompt_tokens is not None or facts.media_items:
        return ()
    if facts.max_output_tokens is not None and facts.max_output_tokens > max_model_len:
        return ()  # refused from the body alone, whatever the prompt
    chat = facts.route in {CHAT_ROUTE, RESPONSES_ROUTE} or facts.route.endswith(BATCH_CHAT_SUFFIX)
    if not (chat and chats_exact) and facts.route != COMPLETIONS_ROUTE:
        return ()
    return tuple(index for index, count in enumerate(facts.prompts) if count >= max_model_len)


def tokenize_bodies(
    route: str, body: dict[str, Any], chat: EngineChat, indexes: tuple[int, ...]
) -> dict[int, dict[str, Any]] | None:
    """A ``/tokenize`` request for each prompt of ``indexes`` vLLM must count, or ``None`` when one cannot be.

    A completion's token-id prompts need none: their length is vLLM's count.
    """
    if route == COMPLETIONS_ROUTE:
        return _completion_asks(body, indexes)
    conversations = _conversations(route, body)
    if not isinstance(conversations, list) or any(index >= len(conversations) for index in indexes):
        return None
    asked = {index: conversations[index] for index in indexes}
    if not all(isinstance(messages, list) for messages in asked.values()):
        return None
    rendered = as_rendered(route, body, chat.reasoning_effort_map)  # the fields vLLM renders the prompt with
    common = {key: rendered[key] for key in CHAT_FIELDS if rendered.get(key) is not None}
    if variables := template_kwargs(rendered):  # a null stays null, as the chat route passes it
        common["chat_template_kwargs"] = variables
    excluded = chat.exclude_tools_when_tool_choice_none and body.get("tool_choice") == "none"
    if rendered.get("tools") is not None and not excluded:
        common["tools"] = rendered["tools"]
    return {index: {**common, "messages": [reasoning_renamed(m) for m in ms]} for index, ms in asked.items()}


def _conversations(route: str, body: dict[str, Any]) -> Any:
    """Each prompt's messages: the batch route's several, a chat's one, a Responses request's as built.

    A Responses request's messages are the ones its route builds (:mod:`sidecar.admission.responses_input`);
    ``None`` where they are not known.
    """
    if route != RESPONSES_ROUTE:
        return body.get("messages") if route.endswith(BATCH_CHAT_SUFFIX) else [body.get("messages")]
    items = body.get("input")
    if (
        not isinstance(items, str | list)
        or body.get("previous_response_id")
        or body.get("previous_input_messages")
    ):
        return None  # a stored conversation vLLM prepends is not in the body: no count of the whole
    messages, known = responses_prompt(
        body, [{"role": "user", "content": items}] if isinstance(items, str) else items
    )
    return [messages] if known else None


def _completion_asks(body: dict[str, Any], indexes: tuple[int, ...]) -> dict[int, dict[str, Any]] | None:
    if body.get("suffix") or body.get("prompt_embeds") is not None:
        return None
    prompt = body.get("prompt")
    items = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    if any(index >= len(items) for index in indexes):
        return None
    if isinstance(prompt, list) and all(type(token) is int for token in prompt):
        return {}  # one prompt of token ids
    given: dict[str, Any] = {key: body[key] for key in ("model", "add_special_tokens") if key in body}
    texts = {index: items[index] for index in indexes if isinstance(items[index], str)}
    return {index: {**given, "prompt": text} for index, text in texts.items()}


def recounted(facts: RequestFacts, counts: Mapping[int, int]) -> RequestFacts:
    """``facts`` with vLLM's counts of the prompts it was asked about: those may refuse the request.

    A recounted prompt's token ids are no longer the sidecar's (they may differ): the facts keep none for
    the request, so its blocks are planned without sharing.
    """
    prompts = tuple(counts.get(index, count) for index, count in enumerate(facts.prompts))
    changed = prompts != facts.prompts
    return dataclasses.replace(
        facts, prompts=prompts, engine_counted=True, prompt_ids=None if changed else facts.prompt_ids
    )
