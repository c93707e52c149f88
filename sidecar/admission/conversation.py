"""A chat request's messages, tools and variables as vLLM hands them to the chat template. Pure.

An exact chat count renders the model's template with what vLLM renders it with, not with the request's JSON
as sent: vLLM 0.32.0 rebuilds every message and dumps every tool through its request models first, and a
template that prints a tool (``tool | tojson``) or a call's arguments prints what vLLM built. Read in vLLM
0.32.0 and checked against the real CPU server (``tests/e2e/test_engine_parity.py`` sends each case to both):

* **Messages** (``_parse_chat_message_content`` and ``_postprocess_messages``,
  ``vllm/renderers/chat_utils.py``, after ``ChatCompletionRequest._normalize_messages_before``,
  ``chat_completion/protocol.py``): a fresh message of ``role`` and ``content`` (the text parts joined by
  newlines for a template of the ``string`` format, text parts for ``openai``; ``None`` is no parts); then
  only ``tool_calls`` (assistant, when not ``None``), ``reasoning`` and its copy ``reasoning_content``
  (assistant; a client's ``reasoning_content`` is renamed to ``reasoning`` first), ``tool_call_id`` (tool),
  ``name`` and ``task`` (when strings) and a developer message's ``tools``; every other key is dropped. A
  system message loses a leading Claude Code billing header line (``_strip_claude_code_billing_header``). A
  tool message's text parts become one string whatever the format. An assistant's empty ``tool_calls`` is
  dropped, and each call's ``arguments`` string is parsed into an object (``{}`` when empty, not JSON, or
  not an object).
* **Tools** (``ChatCompletionToolsParam.model_dump``, ``openai/chat_completion/protocol.py``): ``type``, then
  ``function`` as ``name``, ``description`` and ``parameters`` (``null`` when absent), ``strict`` and
  ``defer_loading`` only when set; other keys dropped. ``tools`` of ``None``, or ``tool_choice`` ``"none"``
  on a server started with ``--exclude-tools-when-tool-choice-none`` (``online_renderer.py``), renders none.
* **Developer messages** (:func:`developer_as_system`, vLLM 0.26.0 to 0.34.0): as system messages, merged into
  one at the front, for a template that does not name the role.
* **Variables**: :func:`template_kwargs` over the server's ``--default-chat-template-kwargs``
  (:func:`with_defaults`); a continued final message is cut where its text ends (:func:`tagged`).

The same rules stand in 0.33.0 and 0.34.0 (``renderers/chat_utils/chat_message.py``, read in the release
wheels); releases before 0.32 keep the billing header line. Whatever differs on the engine in front, its
answers' usage tells (:mod:`sidecar.admission.count_audit`).

What vLLM would refuse (a call that is not an object, a tool without a string name) raises ``ValueError``:
the counter then falls back to its estimate and vLLM gives its own answer. Not rebuilt: the extra fields of
an ``openai``-format text part (``_collect_extra_fields``), which no template known here prints.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.admission.responses_input import responses_chat_fields

CONTENT_FORMATS = ("auto", "string", "openai")
"""vLLM's ``--chat-template-content-format`` (``auto``: told by the template, ``_detect_content_format``)."""


@dataclass(frozen=True, slots=True)
class EngineChat:
    """How vLLM was told to render chats: its flags of these names, which the sidecar is told too."""

    template: str | None = None
    """``--chat-template``'s text; ``None``: the model's own template."""
    content_format: str = "auto"
    """``--chat-template-content-format``: ``auto``, ``string`` or ``openai``."""
    exclude_tools_when_tool_choice_none: bool = False
    """``--exclude-tools-when-tool-choice-none``: a ``tool_choice`` of ``"none"`` renders no tools."""
    default_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """``--default-chat-template-kwargs``: the template's variables where a request sets none."""
    tokenizer_mode: str = "auto"
    """``--tokenizer-mode``: modes other than ``hf`` may tokenize or render with vLLM's own code
    (:mod:`sidecar.admission.tokenizer_mode`)."""
    reasoning_effort_map: Mapping[str, str] = field(default_factory=dict)
    """``--reasoning-effort-map`` (vLLM 0.33.0 and later): a request's reasoning effort rewritten before the
    template sees it (:func:`mapped_effort`)."""


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
"""The efforts a request may name (``ReasoningEffort``, ``vllm/renderers/params.py`` in 0.33.0 and 0.34.0; the
chat request's ``reasoning_effort`` literal in 0.32.0): the keys ``--reasoning-effort-map`` may have."""


def mapped_effort(effort: Any, effort_map: Mapping[str, str]) -> Any:
    """An effort the map names, mapped (``map_reasoning_effort``, ``renderers/params.py``, 0.33.0, 0.34.0)."""
    if effort is None or not effort_map:
        return effort
    return effort_map.get(effort, effort) if isinstance(effort, str) else effort


def as_rendered(route: str, body: dict[str, Any], effort_map: Mapping[str, str]) -> dict[str, Any]:
    """``body`` with the chat fields vLLM renders its prompt with, as vLLM derives them from the request.

    A Responses request's come from :func:`~sidecar.admission.responses_input.responses_chat_fields`; the
    reasoning effort is rewritten by ``effort_map`` (``--reasoning-effort-map``, vLLM 0.33.0 and later)
    before ``enable_thinking`` follows from it (:func:`template_kwargs`). The body sent to vLLM is never
    this one: it only counts the prompt.
    """
    fields = responses_chat_fields(body) if route.endswith("/responses") else {}
    effort = fields.get("reasoning_effort", body.get("reasoning_effort"))
    if effort is not None and effort_map:
        fields["reasoning_effort"] = mapped_effort(effort, effort_map)
    return {**body, **fields} if fields else body


BILLING_HEADER = "x-anthropic-billing-header"
"""Claude Code's per-request attribution line, dropped from system text (``_CLAUDE_CODE_BILLING_HEADER``)."""


def _parts(content: Any) -> list[Any]:
    """A message's content as a list of parts (a string is one text part; anything but a list, none)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def _part_text(part: Any) -> str | None:
    """The text of a text part (a bare string, or a dict with a string ``text``)."""
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        return str(part["text"])
    return None


def content_texts(content: Any) -> list[str]:
    """The text parts of a chat message's content (a string, or a list of strings and text parts)."""
    return [text for part in _parts(content) if (text := _part_text(part)) is not None]


def _is_text_part(part: Any) -> bool:
    """A bare string or a ``{"type": "text"}`` part: the parts vLLM strips the billing header from."""
    return isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")


def _without_billing_header(parts: list[Any]) -> list[Any]:
    """System parts less a leading billing-header line; a part that held only that line goes."""
    kept: list[Any] = []
    for part in parts:
        text = _part_text(part)
        if text is None or not text.startswith(BILLING_HEADER) or not _is_text_part(part):
            kept.append(part)
        elif rest := text.partition("\n")[2]:
            kept.append(rest if isinstance(part, str) else {**part, "text": rest})
    return kept


def _arguments(value: Any) -> dict[str, Any]:
    """A call's ``arguments`` as the template gets them: an object, ``{}`` for anything else."""
    if not value:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def _tool_calls(calls: list[Any]) -> list[dict[str, Any]]:
    """An assistant's calls with their arguments parsed; ``ValueError`` for one vLLM refuses."""
    shaped = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ValueError("vLLM refuses a tool call that is not a function object")
        shaped.append({**call, "function": {**function, "arguments": _arguments(function.get("arguments"))}})
    return shaped


def reasoning_renamed(message: Any) -> Any:
    """A message as the chat route's ``_normalize_messages_before`` leaves it: ``reasoning_content`` renamed.

    A client's ``reasoning_content`` becomes its ``reasoning`` unless that is set (0.32.0,
    ``ChatCompletionRequest``, ``chat_completion/protocol.py``).
    """
    if not isinstance(message, dict) or "reasoning_content" not in message:
        return message
    renamed = {key: value for key, value in message.items() if key != "reasoning_content"}
    if message["reasoning_content"] is not None and renamed.get("reasoning") is None:
        renamed["reasoning"] = message["reasoning_content"]
    return renamed


def template_message(message: dict[str, Any], content_format: str) -> dict[str, Any]:
    """One message as vLLM 0.32 hands it to a template of ``content_format`` (``string`` or ``openai``)."""
    role = message.get("role")
    parts = _parts(message.get("content"))
    if role == "system":
        parts = _without_billing_header(parts)
    texts = content_texts(parts)
    content: Any = (
        [{"type": "text", "text": t} for t in texts] if content_format == "openai" else "\n".join(texts)
    )
    shaped: dict[str, Any] = {"role": role, "content": content}
    reasoning = reasoning_renamed(message).get("reasoning")
    if role == "assistant":
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            shaped["tool_calls"] = _tool_calls(calls)
        elif calls is not None and not isinstance(calls, list):
            raise ValueError("vLLM refuses tool_calls that are not a list")
        if reasoning is not None:
            shaped["reasoning"] = shaped["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            shaped["tool_call_id"] = message["tool_call_id"]
        if isinstance(content, list):
            shaped["content"] = "\n".join(texts)
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            shaped[key] = message[key]
    if role == "developer":
        shaped["tools"] = message.get("tools")
    return shaped


def _function(function: Any, defer_loading: Any) -> dict[str, Any]:
    """``FunctionDefinition.model_dump``: name, description, parameters; strict and deferral when set."""
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError("vLLM refuses a tool without a function name")
    description, parameters = function.get("description"), function.get("parameters")
    if not isinstance(description, str | None) or not isinstance(parameters, dict | None):
        raise ValueError("vLLM refuses a tool whose description is not text or parameters not an object")
    dumped = {"name": function["name"], "description": description, "parameters": parameters}
    deferred = function.get("defer_loading")
    deferred = defer_loading if deferred is None else deferred  # the tool's own, when the function has none
    for key, value in (("strict", function.get("strict")), ("defer_loading", deferred)):
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"vLLM reads a tool's {key} as a boolean")  # pydantic's coercion is not repeated
        if value is not None:
            dumped[key] = value
    return dumped


def tools_reach_template(tools: Any, tool_choice: Any, *, exclude_when_choice_none: bool) -> bool:
    """Whether vLLM hands the template tools (an empty list counts).

    None for ``tools`` of ``None``, or for ``tool_choice`` ``"none"`` under
    ``--exclude-tools-when-tool-choice-none`` (``online_renderer.py``).
    """
    return tools is not None and not (tool_choice == "none" and exclude_when_choice_none)


def template_tools(
    tools: Any, tool_choice: Any = None, *, exclude_when_choice_none: bool = False
) -> list[dict[str, Any]] | None:
    """The request's ``tools`` as vLLM 0.32 dumps them for the template; ``None`` renders none."""
    if not tools_reach_template(tools, tool_choice, exclude_when_choice_none=exclude_when_choice_none):
        return None
    if not isinstance(tools, list):
        raise ValueError("vLLM refuses tools that are not a list")
    dumped = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ValueError("vLLM refuses a tool that is not a function")
        function = _function(tool.get("function"), tool.get("defer_loading"))
        entry: dict[str, Any] = {"type": "function", "function": function}
        if tool.get("defer_loading") is not None:
            entry["defer_loading"] = tool["defer_loading"]
        dumped.append(entry)
    return dumped


def rendered_tools(tools: Any, tool_choice: Any, variables: Mapping[str, Any], chat: EngineChat) -> Any:
    """The tools vLLM hands the template: merged as ``preprocess_chat`` merges them (``online_renderer.py``).

    The request's ``tools`` as dumped (:func:`template_tools`) over the server's default variables, under
    the request's own ``chat_template_kwargs`` (``variables``): a ``tools`` set there is rendered as sent.
    ``None``: no tools reach the template.
    """
    dumped = template_tools(
        tools, tool_choice, exclude_when_choice_none=chat.exclude_tools_when_tool_choice_none
    )
    if variables.get("tools") not in (None, "auto"):
        return variables["tools"]
    return dumped if dumped is not None else chat.default_template_kwargs.get("tools")


REQUEST_BOOLEANS = ("add_generation_prompt", "continue_final_message")
"""Request fields vLLM always merges over ``chat_template_kwargs`` (never ``None``: their defaults count)."""


def template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """The template's variables as vLLM 0.32 builds them (``ChatCompletionRequest.build_chat_params``).

    The client's ``chat_template_kwargs``, overridden by the request's own fields that are set:
    ``continue_final_message``, ``documents``, ``reasoning_effort`` (and, with it, ``enable_thinking``
    unless the client set that), as ``merge_kwargs`` (``renderers/params.py``) merges them. A Responses
    request, or an effort ``--reasoning-effort-map`` rewrites, is read through :func:`as_rendered` first.
    """
    given = body.get("chat_template_kwargs")  # the request's own booleans (defaults too) win over copies
    user = {k: v for k, v in given.items() if k not in REQUEST_BOOLEANS} if isinstance(given, dict) else {}
    own = {key: body.get(key) for key in ("continue_final_message", "documents", "reasoning_effort")}
    if own["reasoning_effort"] is not None and "enable_thinking" not in user:
        own["enable_thinking"] = own["reasoning_effort"] != "none"
    return user | {key: value for key, value in own.items() if value not in (None, "auto")}


def with_defaults(defaults: Mapping[str, Any], variables: dict[str, Any]) -> dict[str, Any]:
    """``ChatParams.with_defaults`` (``renderers/params.py``): the server's defaults under what a request set.

    A request's ``None`` or ``"auto"`` leaves the default, or nothing (``merge_kwargs``): vLLM's chat route
    always merges, its own defaults holding at least ``tokenize`` (``preprocess_chat``).
    """
    return {**defaults, **{key: value for key, value in variables.items() if value not in (None, "auto")}}


def names_developer(template: str) -> bool:
    """Whether a template text names the ``developer`` role (``_detect_developer_role_support``)."""
    return '"developer"' in template or "'developer'" in template


def developer_as_system(messages: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """Built messages as vLLM hands them to ``template``: developer ones as system ones where it lacks them.

    vLLM 0.26.0 to 0.34.0 (``safe_apply_chat_template``, ``renderers/hf.py``): when a message is a developer's
    and the template does not name the role, each becomes a system message without its ``tools``
    (``_convert_developer_to_system``), then every system message is merged into one at the front when one
    stands elsewhere or there are several (``_consolidate_system_messages``): their non-empty texts (a list's
    text parts joined by newlines) joined by blank lines, the other messages after it in their order.
    """
    if not any(m.get("role") == "developer" for m in messages) or names_developer(template):
        return messages
    converted = [
        {**{k: v for k, v in m.items() if k != "tools"}, "role": "system"}
        if m.get("role") == "developer"
        else m
        for m in messages
    ]
    texts: list[str] = []
    others: list[dict[str, Any]] = []
    merge = False
    for index, message in enumerate(converted):
        if message.get("role") != "system":
            others.append(message)
            continue
        merge = merge or index > 0 or bool(texts)
        content = message.get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                part["text"] if isinstance(part, dict) else part
                for part in content
                if (isinstance(part, dict) and "text" in part) or isinstance(part, str)
            )
        if content:
            texts.append(content)
    return [{"role": "system", "content": "\n\n".join(texts)}, *others] if merge else converted


CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
"""transformers' marker for the end of a message to continue (``continue_final_message_tag``)."""


def tagged(message: dict[str, Any]) -> dict[str, Any]:
    """The final message with the tag after its (last) text, or a ``ValueError`` when it has none."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": content + CONTINUE_TAG}
    if isinstance(content, list):
        for index in range(len(content) - 1, -1, -1):
            if isinstance(part := content[index], dict) and isinstance(part.get("text"), str):
                parts = [
                    *content[:index],
                    {**part, "text": part["text"] + CONTINUE_TAG},
                    *content[index + 1 :],
                ]
                return {**message, "content": parts}
    raise ValueError("continue_final_message is set but the final message has no text to continue")
