"""A Responses request's ``input`` items as vLLM turns them into chat messages before its template. Pure.

vLLM 0.32.0 builds a Responses prompt from chat messages (``construct_chat_messages_with_tool_call``,
``vllm/entrypoints/openai/responses/utils.py``), one input item at a time, each either a new message or merged
into the assistant message before it (some chat messages span several items: reasoning, then tool calls):

* ``function_call`` (and ``custom_tool_call``, whose ``input`` becomes the arguments ``{"input": ...}``): a
  tool call ``{"id": call_id, "function": {"name", "arguments"}, "type": "function"}``, its name
  ``namespace__name`` when a namespace is given (``flat_namespace_tool_name``); appended to the previous
  assistant message's ``tool_calls``, else a new assistant message holding it;
* ``reasoning``: its first ``content`` text, else its first ``summary`` text, else ``""``, as the previous
  assistant message's ``reasoning`` when it has none, else a new assistant message; encrypted content is
  refused by vLLM;
* an assistant output message (``type`` ``message``, ``role`` ``assistant``) or an assistant message given as
  a plain object: its (first) text as the previous assistant message's ``content`` when it has none, else a
  new assistant message;
* ``function_call_output`` (and ``custom_tool_call_output``): a tool message of its ``output`` and
  ``call_id``;
* any other item with a ``role``: itself (the chat route's message rebuilding follows,
  :mod:`sidecar.admission.conversation`); anything else vLLM refuses ("Unsupported input item type").

The sidecar passed the items to the template as they were: on the real server (Qwen3's template) a call and
its output counted 29 tokens where vLLM builds 138, two calls 29 for 231. What vLLM would refuse raises
``ValueError``: the prompt is then estimated, never refused here. The same conversion stands in 0.33.0 and
0.34.0 but for two leniencies (an output message without content, a reasoning item kept as a plain object),
which vLLM 0.32 refuses or fails on; here they are estimates too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})
OUTPUT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})
NAMESPACE_SEPARATOR = "__"
"""``_NAMESPACE_TOOL_SEPARATOR`` (``vllm/tool_parsers/utils.py``)."""


def chat_messages(items: list[Any]) -> list[dict[str, Any]]:
    """The chat messages vLLM builds from Responses ``input`` items (see the module docstring)."""
    messages: list[dict[str, Any]] = []
    for item in items:
        message = _message(item, messages[-1] if messages else None)
        if message is not None:
            messages.append(message)
    return messages


def _message(item: Any, previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """A new message for ``item``, or ``None`` when it was merged into ``previous`` (an assistant's)."""
    if not isinstance(item, dict):
        raise ValueError("an input item that is not an object")
    assistant = previous if previous is not None and previous.get("role") == "assistant" else None
    kind = item.get("type")
    if kind in CALL_ITEMS:
        return _merged(assistant, "tool_calls", _tool_call(item))
    if kind == "reasoning" and "role" not in item:
        return _merged(assistant, "reasoning", _reasoning(item))
    if kind in OUTPUT_ITEMS:
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if item.get("role") == "assistant" and (text := _assistant_text(item)) is not None:
        return _merged(assistant, "content", text)
    if "role" in item:
        return dict(item)  # a copy: a later item may merge into it, and the request stays as sent
    raise ValueError(f"vLLM refuses an input item of type {kind!r}")


def _merged(assistant: dict[str, Any] | None, key: str, value: Any) -> dict[str, Any] | None:
    """``value`` under ``key`` of the previous assistant message where it can go, else a new message."""
    if key == "tool_calls":
        if assistant is not None and isinstance(calls := assistant.get("tool_calls"), list | None):
            assistant["tool_calls"] = [*(calls or []), value]
            return None
        return {"role": "assistant", "tool_calls": [value]}
    if assistant is not None and assistant.get(key) is None:
        assistant[key] = value
        return None
    return {"role": "assistant", key: value}


def _tool_call(item: dict[str, Any]) -> dict[str, Any]:
    """``ChatCompletionMessageToolCallParam`` of a function or custom tool call item."""
    name, call_id = item.get("name"), item.get("call_id")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise ValueError("a tool call item without a string name and call_id")
    if item.get("type") == "custom_tool_call":
        arguments: Any = json.dumps({"input": item.get("input") or ""}, ensure_ascii=False)
    else:
        arguments = item.get("arguments")
        if not isinstance(arguments, str):
            raise ValueError("a function call item's arguments must be a string")
        if isinstance(namespace := item.get("namespace"), str) and namespace:
            name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    return {"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}


def _reasoning(item: dict[str, Any]) -> str:
    """A reasoning item's text: its first content part's, else its first summary's, else empty."""
    if item.get("encrypted_content"):
        raise ValueError("vLLM refuses encrypted reasoning content")
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            first = parts[0]
            if not isinstance(first, dict) or not isinstance(first.get("text"), str):
                raise ValueError(f"a reasoning item's {key} without text")
            return str(first["text"])
    if not isinstance(item.get("summary"), list):
        raise ValueError("a reasoning item needs a summary list")
    return ""


def _assistant_text(item: dict[str, Any]) -> str | None:
    """An assistant message's text as vLLM takes it: the string, or the first part's ``text``."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        first = content[0]
        text = first.get("text") if isinstance(first, dict) else None
        if item.get("type") == "message" and "id" in item and not isinstance(text, str):
            raise ValueError("an output message whose first part has no text")
        return text if isinstance(text, str) else None
    if item.get("type") == "message" and "id" in item:
        raise ValueError("an output message without content")  # vLLM 0.32 fails on it (0.33: empty text)
    return None


def responses_prompt(body: dict[str, Any], items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The messages of a Responses prompt (``construct_input_messages``), and whether they are vLLM's.

    ``instructions`` lead as a system message; ``items`` (the ``input``, a string already made one user
    message) are converted as the module docstring says. Items vLLM would refuse are kept as given, with
    ``False``: such a prompt is estimated.
    """
    try:
        messages, known = chat_messages(items), True
    except ValueError:
        messages, known = items, False
    if isinstance(instructions := body.get("instructions"), str) and instructions:
        messages = [{"role": "system", "content": instructions}, *messages]
    return messages, known


CUSTOM_TOOL_PARAMETERS: Final = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The freeform text payload for this tool."}},
    "required": ["input"],
    "additionalProperties": False,
}
"""The single-string function a ``custom`` tool is shown as (``custom_tool_parameters``, ``tool_parsers``)."""


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """A Responses request's ``tools`` as the chat tools vLLM hands the template (``construct_tool_dicts``).

    Function tools as they are, a namespace's functions named ``namespace__name``, a ``custom`` tool as a
    function taking one string, in request order; other tool types (web search, MCP, ...) are never shown to
    the model (``get_function_tools``, ``tool_parsers/utils.py``). No tools: ``None``. Each becomes
    ``{"type": "function", "function": ...}``, which the chat route's dump then shapes
    (:func:`~sidecar.admission.conversation.template_tools`). What vLLM would refuse raises ``ValueError``.
    """
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise ValueError("vLLM refuses tools that are not a list of objects")
    functions: list[dict[str, Any]] = []
    for tool in tools:
        kind = tool.get("type")
        if kind == "function":
            functions.append(tool)
        elif kind == "namespace":
            inner, namespace = tool.get("tools"), tool.get("name")
            if not isinstance(inner, list) or not isinstance(namespace, str) or "description" not in tool:
                raise ValueError("vLLM refuses a namespace tool without a name, a description and its tools")
            functions.extend(
                {**member, "name": f"{namespace}{NAMESPACE_SEPARATOR}{member.get('name')}"}
                for member in inner
                if isinstance(member, dict) and member.get("type") == "function"
            )
        elif kind == "custom":
            shim = {"name": tool.get("name"), "description": tool.get("description")}
            functions.append(shim | {"parameters": CUSTOM_TOOL_PARAMETERS})
    return [{"type": "function", "function": {k: v for k, v in f.items() if k != "type"}} for f in functions]


def responses_chat_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat fields vLLM derives from a Responses request (``ResponsesRequest.build_chat_params``, 0.32.0).

    ``reasoning.effort`` is the template's ``reasoning_effort``; the final message is continued, with no
    generation prompt, when the last input item is a message or reasoning item whose ``status`` is
    ``in_progress`` or ``incomplete`` (``should_continue_final_message``, ``responses/utils.py``). The
    Responses request has no ``documents``, ``reasoning_effort``, ``continue_final_message``,
    ``add_generation_prompt``, ``chat_template`` or ``add_special_tokens`` fields: a client's are ignored, as
    vLLM ignores them, and its rendered prompt is tokenized with special tokens (``build_tok_params`` passes
    none, so ``TokenizeParams``' default, true, holds: a tokenizer that adds a BOS adds it here, unlike the
    chat route; checked on the real server, 19 tokens where the same chat has 18).
    """
    reasoning = body.get("reasoning")
    items = body.get("input")
    last = items[-1] if isinstance(items, list) and items else None
    continued = (
        isinstance(last, dict)
        and last.get("type", "message") in ("message", "reasoning")
        and last.get("status") in ("in_progress", "incomplete")
    )
    return {
        "reasoning_effort": reasoning.get("effort") if isinstance(reasoning, dict) else None,
        "continue_final_message": continued,
        "add_generation_prompt": not continued,
        "documents": None,
        "chat_template": None,  # the server's template: the Responses request cannot bring its own
        "add_special_tokens": True,  # build_tok_params leaves TokenizeParams' default: a BOS is added
        "tools": _chat_tools(body.get("tools")),
    }


def _chat_tools(tools: Any) -> Any:
    """The Responses tools as chat tools (:func:`chat_tools`), or as sent where vLLM refuses them.

    The chat route's dump then refuses them too, so the prompt is estimated.
    """
    try:
        return chat_tools(tools)
    except ValueError:
        return tools
