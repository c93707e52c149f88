"""Which prompts vLLM is asked to count before a refusal for length, what it is sent, what its count decides.

Before, a sidecar whose tokenizer or chat template was not vLLM's refused a chat vLLM serves until an answer's
usage disagreed with one of its counts. Now a prompt the sidecar would refuse as too long is counted by vLLM's
``/tokenize`` first (:mod:`sidecar.admission.recount`), and the refusal stands on vLLM's count alone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sidecar.admission.body import RequestFacts, request_facts
from sidecar.admission.conversation import EngineChat
from sidecar.admission.parity import engine_refusal
from sidecar.admission.recount import recounted, suspects, tokenize_bodies
from sidecar.admission.tokens import EstimatingCounter

CHAT = RequestFacts(
    prompts=(1030,), max_output_tokens=10, exact=True, route="/v1/chat/completions", model="m"
)
COMPLETION = replace(CHAT, route="/v1/completions")


@pytest.mark.parametrize(
    ("facts", "chats_exact", "asked"),
    [
        (CHAT, True, (0,)),
        (replace(CHAT, prompts=(1024,)), True, (0,)),  # no room for one output token: refused
        (replace(CHAT, prompts=(1023,)), True, ()),  # served: nothing to ask
        (CHAT, False, ()),  # the sidecar does not render chats as vLLM does (no template, gpt-oss)
        (replace(CHAT, exact=False), True, (0,)),  # an estimate that says too long is asked too
        (replace(CHAT, route="/v1/chat/completions/batch", prompts=(5, 1100, 2000)), True, (1, 2)),
        (replace(COMPLETION, exact=False), False, (0,)),  # plain text needs no template
        (replace(CHAT, route="/v1/responses"), True, (0,)),  # asked as the chat the Responses route renders
        (replace(CHAT, route="/v1/responses"), False, ()),
        (replace(CHAT, route="/v1/messages"), True, ()),
        (replace(CHAT, media_items=1), True, ()),  # vLLM would fetch and process the media again
        (replace(CHAT, truncate_prompt_tokens=-1), True, ()),  # vLLM truncates instead of refusing
        (replace(CHAT, max_output_tokens=2000), True, ()),  # refused from the body alone
    ],
)
def test_which_prompts_vllm_is_asked_to_count(
    facts: RequestFacts, chats_exact: bool, asked: tuple[int, ...]
) -> None:
    assert suspects(facts, 1024, chats_exact=chats_exact) == asked


def test_nothing_is_asked_without_a_context_length() -> None:
    assert suspects(CHAT, None, chats_exact=True) == ()


TOOLS = [{"type": "function", "function": {"name": "f"}}]


@pytest.mark.parametrize(
    ("body", "chat", "sent"),
    [
        (  # generation fields stay behind; the chat's template fields go as they were sent
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "stream": True,
             "add_generation_prompt": False, "add_special_tokens": True, "chat_template": "{{ 1 }}"},
            EngineChat(),
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "add_generation_prompt": False,
             "add_special_tokens": True, "chat_template": "{{ 1 }}"},
        ),
        (  # variables the chat route builds and /tokenize has no field for go as template variables
            {"messages": [], "documents": [{"t": 1}], "reasoning_effort": "low",
             "chat_template_kwargs": {"x": 1}, "continue_final_message": True},
            EngineChat(),
            {"messages": [], "continue_final_message": True, "chat_template_kwargs": {
                "x": 1, "continue_final_message": True, "documents": [{"t": 1}], "reasoning_effort": "low",
                "enable_thinking": True}},
        ),
        ({"messages": [], "tools": TOOLS}, EngineChat(), {"messages": [], "tools": TOOLS}),
        (  # a null stays null: the chat route passes it, and the server's default fills it in both
            {"messages": [], "chat_template_kwargs": {"greeting": None}},
            EngineChat(),
            {"messages": [], "chat_template_kwargs": {"greeting": None}},
        ),
        (  # the chat route renames a client's reasoning_content; /tokenize would drop it
            {"messages": [{"role": "assistant", "content": "b", "reasoning_content": "x"},
                          {"role": "assistant", "content": "c", "reasoning": "y", "reasoning_content": "z"}]},
            EngineChat(),
            {"messages": [{"role": "assistant", "content": "b", "reasoning": "x"},
                          {"role": "assistant", "content": "c", "reasoning": "y"}]},
        ),
        (  # the chat route renders no tools for "none" under --exclude-tools-when-tool-choice-none
            {"messages": [], "tools": TOOLS, "tool_choice": "none"},
            EngineChat(exclude_tools_when_tool_choice_none=True),
            {"messages": []},
        ),
        (
            {"messages": [], "tools": TOOLS, "tool_choice": "none"},
            EngineChat(),
            {"messages": [], "tools": TOOLS},
        ),
    ],
)  # fmt: skip
def test_a_chat_is_sent_as_the_chat_route_renders_it(
    body: dict[str, Any], chat: EngineChat, sent: dict[str, Any]
) -> None:
    assert tokenize_bodies("/v1/chat/completions", body, chat, (0,)) == {0: sent}


def test_each_conversation_of_a_batch_is_asked_on_its_own() -> None:
    one, two = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    asked = tokenize_bodies("/v1/chat/completions/batch", {"messages": [one, two]}, EngineChat(), (1,))
    assert asked == {1: {"messages": two}}
    assert tokenize_bodies("/v1/chat/completions/batch", {"messages": [one]}, EngineChat(), (1,)) is None


@pytest.mark.parametrize(
    ("body", "indexes", "sent"),
    [
        ({"model": "m", "prompt": "abc", "max_tokens": 3}, (0,), {0: {"model": "m", "prompt": "abc"}}),
        ({"prompt": "abc", "add_special_tokens": False}, (0,), {0: {"prompt": "abc", "add_special_tokens": False}}),
        ({"prompt": ["a", [1, 2], "c"]}, (1, 2), {2: {"prompt": "c"}}),  # token ids are vLLM's count already
        ({"prompt": [1, 2, 3]}, (0,), {}),
        ({"prompt": "abc", "suffix": "d"}, (0,), None),  # vLLM renders the suffix with FIM tokens
        ({"prompt": "abc", "prompt_embeds": "e"}, (0,), None),
        ({"prompt": ["a"]}, (1,), None),
    ],
)  # fmt: skip
def test_a_completion_sends_each_text_prompt_with_its_special_tokens_flag(
    body: dict[str, Any], indexes: tuple[int, ...], sent: dict[int, dict[str, Any]] | None
) -> None:
    assert tokenize_bodies("/v1/completions", body, EngineChat(), indexes) == sent


def test_vllms_count_decides_the_refusal_whatever_the_route_trust() -> None:
    served = recounted(CHAT, {0: 1000})
    assert served.prompts == (1000,)
    assert served.engine_counted
    assert engine_refusal(served, 1024) is None  # the sidecar's 1,030 would have refused it
    refused = recounted(replace(CHAT, exact=False), {0: 1050})
    error = engine_refusal(refused, 1024, counts_trusted=False)
    assert error is not None
    assert error.param == "prompt"
    assert "has 1050" in error.message  # vLLM's count, not the sidecar's
    assert engine_refusal(replace(CHAT, exact=False), 1024) is None  # an estimate alone never refuses


def test_a_batch_refuses_on_the_prompt_vllm_counted_too_long() -> None:
    batch = replace(CHAT, route="/v1/chat/completions/batch", prompts=(5, 1100, 1200))
    error = engine_refusal(recounted(batch, {1: 900, 2: 1100}), 1024, counts_trusted=False)
    assert error is not None
    assert "prompt 2 of the batch has 1100" in error.message
    assert engine_refusal(recounted(batch, {1: 900, 2: 1000}), 1024) is None


def test_a_recount_keeps_the_token_ids_only_when_the_counts_agree() -> None:
    facts = request_facts("/v1/completions", {"prompt": [[1] * 1030]}, EstimatingCounter())
    assert facts.prompt_ids is not None
    assert recounted(facts, {}).prompt_ids == facts.prompt_ids
    assert recounted(facts, {0: 1030}).prompt_ids == facts.prompt_ids
    assert recounted(facts, {0: 900}).prompt_ids is None


def test_a_responses_prompt_is_asked_as_the_chat_its_route_renders() -> None:
    """The items, tools and variables the Responses route builds, with special tokens, as it tokenizes."""
    body = {
        "model": "m", "instructions": "be brief", "reasoning": {"effort": "none"},
        "input": [{"role": "user", "content": "q"},
                  {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}],
        "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}],
    }  # fmt: skip
    asks = tokenize_bodies("/v1/responses", body, EngineChat(), (0,))
    assert asks == {0: {
        "model": "m", "add_generation_prompt": True, "continue_final_message": False, "add_special_tokens": True,
        "chat_template_kwargs": {"reasoning_effort": "none", "enable_thinking": False, "continue_final_message": False},
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
                     {"role": "assistant", "tool_calls": [
                         {"id": "c", "function": {"name": "f", "arguments": "{}"}, "type": "function"}]}],
    }}  # fmt: skip
    for unseen in ({"previous_response_id": "r"}, {"input": [{"type": "web_search_call", "id": "w"}]}):
        assert tokenize_bodies("/v1/responses", {**body, **unseen}, EngineChat(), (0,)) is None
