"""The Anthropic Messages API (``/v1/messages``, served by vLLM 0.32): admitted like a chat, never refused on a
count, and answered in the shape its clients read. Until 2026-12-05 the route bypassed admission entirely."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.admission.anthropic import chat_messages
from sidecar.admission.body import request_facts
from sidecar.admission.outcomes import Reason, RefusedError
from sidecar.admission.parity import engine_refusal
from sidecar.admission.tokens import EstimatingCounter, load_counter
from sidecar.server.proxy import GENERATION_PATHS
from sidecar.server.wire import error_response
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

ROUTE = "/v1/messages"
SYSTEM_BLOCKS = [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]
TOOL_TURN = [
    {"role": "user", "content": "the KV cache"},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "grow", "input": {"n": 2}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "grown"}]},
]


@pytest.mark.parametrize(
    ("body", "messages", "media"),
    [
        (
            {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]},
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            0,
        ),
        (  # vLLM joins system blocks with "" (``_convert_system_message``)
            {
                "system": SYSTEM_BLOCKS,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            },
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
            0,
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {}}, {"type": "text", "text": "x"}],
                    }
                ]
            },
            [{"role": "user", "content": "x"}],
            1,
        ),
        (
            {"messages": TOOL_TURN},
            [
                {"role": "user", "content": "the KV cache"},
                {"role": "assistant", "content": '{"name": "grow", "input": {"n": 2}}'},
                {"role": "user", "content": '{"tool_use_id": "t1", "content": "grown"}'},
            ],
            0,
        ),
    ],
)
def test_a_request_becomes_the_chat_vllm_renders(
    body: dict[str, Any], messages: list[dict[str, Any]], media: int
) -> None:
    converted, tools, items = chat_messages(body)
    assert (converted, tools, items) == (messages, None, media)


def test_tools_become_openai_functions() -> None:
    tool = {"name": "grow", "description": "grows it", "input_schema": {"type": "object"}}
    _, tools, _ = chat_messages({"messages": [], "tools": [tool]})
    expected = {"name": "grow", "description": "grows it", "parameters": {"type": "object"}}
    assert tools == [{"type": "function", "function": expected}]


def test_the_facts_are_a_chats_with_anthropics_fields_only(model_dir: Path) -> None:  # noqa: F811
    counter = load_counter(str(model_dir))
    body = {
        "model": "m", "max_tokens": 64, "system": "be brief", "stream": True, "cache_salt": "s",
        "messages": [{"role": "user", "content": "the KV cache grows"}],
        "n": 3, "ignore_eos": True, "priority": 5, "min_tokens": 9,  # not the Anthropic request's: vLLM ignores them
    }  # fmt: skip
    facts = request_facts(ROUTE, body, counter)
    rendered = counter.chat_tokens(chat_messages(body)[0])
    assert rendered is not None
    assert facts.prompts == (len(rendered),)
    assert (facts.exact, facts.max_output_tokens, facts.choices, facts.ignore_eos) == (False, 64, 1, False)
    assert (facts.priority, facts.min_output_tokens, facts.stream, facts.cache_salt) == (None, 0, True, "s")
    assert facts.prompt_ids == (tuple(rendered),)  # for shared blocks, not for refusals
    assert facts.prompts[0] > 30
    assert engine_refusal(replace(facts, max_output_tokens=16), 30) is None  # a near count never refuses
    estimated = request_facts(ROUTE, body, EstimatingCounter())
    assert (estimated.exact, estimated.prompt_ids) == (False, None)


def test_an_output_bound_over_the_context_is_refused_as_vllm_refuses_it() -> None:
    """vLLM 0.32 answers 400 "max_completion_tokens=5000 cannot be greater than max_model_len=1024"."""
    facts = request_facts(
        ROUTE, {"max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]}, EstimatingCounter()
    )
    refusal = engine_refusal(facts, 1024)
    assert refusal is not None
    assert refusal.reason is Reason.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.parametrize("messages", [None, [], "hi"])
def test_messages_must_be_a_non_empty_list(messages: Any) -> None:
    body = {"max_tokens": 5} if messages is None else {"max_tokens": 5, "messages": messages}
    with pytest.raises(RefusedError, match="messages"):
        request_facts(ROUTE, body, EstimatingCounter())


def test_the_route_is_admitted_and_answered_in_anthropics_shape() -> None:
    assert ROUTE in GENERATION_PATHS
    response = error_response(RefusedError(Reason.QUEUE_FULL, "the queue is full", retry_after=3), ROUTE)
    assert response.status == 429
    assert response.headers["Retry-After"] == "3"
    assert response.headers["X-KV-Sidecar-Reason"] == "queue-full"
    assert response.text is not None
    body = json.loads(response.text)
    assert body == {"type": "error", "error": {"type": "rate_limit_error", "message": "the queue is full"}}
    openai = json.loads(
        error_response(RefusedError(Reason.QUEUE_FULL, "full"), "/v1/chat/completions").text or ""
    )
    assert openai["error"]["code"] == "queue-full"
