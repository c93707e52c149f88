"""A Responses request's ``input`` items as vLLM 0.32 turns them into chat messages.

``construct_chat_messages_with_tool_call`` (``responses/utils.py``) makes function calls an assistant's
``tool_calls`` (merged into the assistant message before them), their outputs tool messages, a reasoning item
the assistant's ``reasoning``, an output message its ``content``. The sidecar rendered the items as given: on the
real server a call and its output counted 29 tokens where vLLM builds 138 (``tests/e2e/test_chat_template_flag.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.responses_input import CUSTOM_TOOL_PARAMETERS, chat_messages, chat_tools
from sidecar.admission.tokens import load_counter
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

USER = {"role": "user", "content": "weather?"}
CALL = {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Paris"}'}
CALLED = {"id": "c1", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}, "type": "function"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
TOOL = {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
THOUGHT = {
    "type": "reasoning",
    "id": "r1",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "hm"}],
}
ANSWER = {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
          "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]}  # fmt: skip


@pytest.mark.parametrize(
    ("items", "messages"),
    [
        ([USER], [USER]),
        ([USER, CALL, OUTPUT], [USER, {"role": "assistant", "tool_calls": [CALLED]}, TOOL]),
        (  # a second call joins the first one's message
            [USER, CALL, {**CALL, "call_id": "c2"}],
            [USER, {"role": "assistant", "tool_calls": [CALLED, {**CALLED, "id": "c2"}]}],
        ),
        (  # reasoning, then a call, then the answer: one assistant message
            [USER, THOUGHT, CALL, ANSWER],
            [USER, {"role": "assistant", "reasoning": "hm", "tool_calls": [CALLED], "content": "Sunny."}],
        ),
        (  # an answer after a tool message starts a new assistant message
            [USER, CALL, OUTPUT, ANSWER],
            [USER, {"role": "assistant", "tool_calls": [CALLED]}, TOOL, {"role": "assistant", "content": "Sunny."}],
        ),
        (  # a summary when there is no content; an assistant's plain object with text parts
            [{**THOUGHT, "content": None, "summary": [{"type": "summary_text", "text": "s"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "a"}]}],
            [{"role": "assistant", "reasoning": "s", "content": "a"}],
        ),
        (
            [{**CALL, "namespace": "geo"}],
            [{"role": "assistant", "tool_calls": [{**CALLED, "function": {**CALLED["function"], "name": "geo__weather"}}]}],
        ),
        (
            [{"type": "custom_tool_call", "call_id": "c1", "name": "sh", "input": "ls"},
             {"type": "custom_tool_call_output", "call_id": "c1", "output": "a.txt"}],
            [{"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "sh", "arguments": '{"input": "ls"}'},
                                                   "type": "function"}]},
             {"role": "tool", "content": "a.txt", "tool_call_id": "c1"}],
        ),
        ([{"role": "assistant", "content": [{"type": "refusal"}]}], [{"role": "assistant", "content": [{"type": "refusal"}]}]),
    ],
)  # fmt: skip
def test_items_become_the_messages_vllm_builds(
    items: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> None:
    assert chat_messages([dict(item) for item in items]) == messages


@pytest.mark.parametrize(
    "item",
    [
        {**THOUGHT, "encrypted_content": "x"},  # "Encrypted content is not supported."
        {"type": "web_search_call", "id": "w1"},  # "Unsupported input item type"
        {**CALL, "arguments": {"city": "Paris"}},  # not a string: pydantic refuses it
        {**ANSWER, "content": []},  # vLLM 0.32 fails on item.content[0]
        "text",
    ],
)
def test_items_vllm_refuses_raise(item: Any) -> None:
    with pytest.raises(ValueError, match=r"refuses|not an object|must be a string|without content"):
        chat_messages([USER, item])


def test_a_tool_calling_input_counts_as_its_chat(model_dir: Path) -> None:  # noqa: F811
    counter = load_counter(str(model_dir))
    responses = request_facts(
        "/v1/responses", {"input": [USER, CALL, OUTPUT], "instructions": "be brief"}, counter
    )
    chat = request_facts(
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                USER,
                {"role": "assistant", "tool_calls": [CALLED]},
                TOOL,
            ]
        },
        counter,
    )
    assert (responses.prompts, responses.prompt_ids, responses.exact) == (chat.prompts, chat.prompt_ids, True)
    refused = request_facts(
        "/v1/responses", {"input": [USER, {"type": "web_search_call", "id": "w1"}]}, counter
    )
    assert (refused.exact, refused.prompt_ids) == (False, None)  # estimated: vLLM answers it


@pytest.mark.parametrize(
    ("tools", "dumped"),
    [
        (None, None),
        ([], None),  # construct_tool_dicts: no tools, none rendered
        ([{"type": "web_search"}], []),  # never shown to the model, but the list is there
        ([{"type": "function", "name": "f", "strict": True}], [{"type": "function", "function": {"name": "f", "strict": True}}]),
        (
            [{"type": "namespace", "name": "geo", "description": "d", "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}]}],
            [{"type": "function", "function": {"name": "geo__f"}}],
        ),
        (
            [{"type": "custom", "name": "sh", "description": "run"}],
            [{"type": "function", "function": {"name": "sh", "description": "run", "parameters": CUSTOM_TOOL_PARAMETERS}}],
        ),
    ],
)  # fmt: skip
def test_tools_become_the_chat_tools_vllm_renders(tools: Any, dumped: Any) -> None:
    assert chat_tools(tools) == dumped


@pytest.mark.parametrize(
    "tools",
    [
        {"type": "function"},
        ["f"],
        [{"type": "namespace", "name": "geo", "tools": []}],
    ],  # no description: refused
)
def test_tools_vllm_refuses_raise(tools: Any) -> None:
    with pytest.raises(ValueError, match=r"refuses|namespace"):
        chat_tools(tools)


def test_the_request_stays_as_sent() -> None:
    """Items merge into the message before them, never into the client's own objects."""
    items = [USER, {"role": "assistant", "content": None}, CALL, THOUGHT]
    sent = [dict(item) for item in items]
    messages = chat_messages(items)
    assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [CALLED], "reasoning": "hm"}
    assert items == sent
