"""Messages and tools as vLLM 0.32 hands them to the chat template, not as the request sent them.

vLLM rebuilds each message (only the keys it knows, a call's ``arguments`` parsed into an object, a tool
message's parts joined, a system message's billing header dropped) and dumps each tool through its request
model (``description`` and ``parameters`` as ``null`` when absent, unknown keys dropped). The sidecar rendered
the request's JSON as sent, so a template that prints tools or calls counted what vLLM never renders: on the
real server a tool with only a name counted 74 tokens where vLLM renders 105, a reordered tool with extra
keys 175 against 154 (an exact count above vLLM's can refuse what vLLM serves). The real server's counts are
checked in ``tests/e2e/test_engine_parity.py``; these tables hold each rule.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from sidecar.admission.body import request_facts
from sidecar.admission.conversation import EngineChat, template_message, template_tools, with_defaults
from sidecar.admission.tokens import load_counter
from sidecar.cli import build_parser
from sidecar.errors import UsageError
from sidecar.flags import json_object, read_chat_template
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

CALL = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}


@pytest.mark.parametrize(
    ("message", "content_format", "shaped"),
    [
        ({"role": "user", "content": "hi", "weight": 3}, "string", {"role": "user", "content": "hi"}),
        ({"role": "user", "content": None}, "string", {"role": "user", "content": ""}),
        ({"role": "user", "content": None}, "openai", {"role": "user", "content": []}),
        (
            {"role": "user", "content": [{"type": "text", "text": "a"}, "b"]},
            "openai",
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ),
        (
            {"role": "user", "content": "hi", "name": "bob"},
            "string",
            {"role": "user", "content": "hi", "name": "bob"},
        ),
        ({"role": "user", "content": "hi", "name": 7}, "string", {"role": "user", "content": "hi"}),
        (
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            "string",
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{**CALL, "function": {"name": "weather", "arguments": {"city": "Paris"}}}],
            },
        ),
        (
            {"role": "assistant", "content": "ok", "tool_calls": []},
            "string",
            {"role": "assistant", "content": "ok"},  # an empty list is dropped
        ),
        (
            {"role": "assistant", "content": "ok", "reasoning_content": "think"},
            "string",
            {"role": "assistant", "content": "ok", "reasoning": "think", "reasoning_content": "think"},
        ),
        (
            {"role": "assistant", "content": "ok", "reasoning": "a", "reasoning_content": "b"},
            "string",
            {"role": "assistant", "content": "ok", "reasoning": "a", "reasoning_content": "a"},
        ),
        ({"role": "user", "content": "ok", "reasoning": "a"}, "string", {"role": "user", "content": "ok"}),
        (
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "22C"}, "sunny"]},
            "openai",
            {"role": "tool", "content": "22C\nsunny", "tool_call_id": "c1"},  # joined whatever the format
        ),
        (
            {"role": "system", "content": "x-anthropic-billing-header: cch=1\nbe brief"},
            "string",
            {"role": "system", "content": "be brief"},
        ),
        (
            {
                "role": "system",
                "content": [{"type": "text", "text": "x-anthropic-billing-header: cch=1"}, "b"],
            },
            "string",
            {"role": "system", "content": "b"},  # a part that held only the header goes
        ),
        (
            {"role": "user", "content": "x-anthropic-billing-header: cch=1\nkept"},
            "string",
            {"role": "user", "content": "x-anthropic-billing-header: cch=1\nkept"},  # system messages only
        ),
        (
            {"role": "developer", "content": "d", "tools": [{"x": 1}]},
            "string",
            {"role": "developer", "content": "d", "tools": [{"x": 1}]},
        ),
    ],
)
def test_messages_are_rebuilt_as_vllm_rebuilds_them(
    message: dict[str, Any], content_format: str, shaped: dict[str, Any]
) -> None:
    assert template_message(message, content_format) == shaped


@pytest.mark.parametrize(
    ("arguments", "parsed"),
    [
        ('{"a": 1}', {"a": 1}),
        ({"a": 1}, {"a": 1}),
        ("", {}),
        (None, {}),
        ("not json", {}),  # vLLM coerces instead of refusing: the history stays usable
        ("[1, 2]", {}),  # JSON, but not an object
        ("42", {}),
    ],
)
def test_call_arguments_become_an_object(arguments: Any, parsed: dict[str, Any]) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    shaped = template_message({"role": "assistant", "content": "", "tool_calls": [call]}, "string")
    assert shaped["tool_calls"][0]["function"]["arguments"] == parsed
    assert call["function"]["arguments"] == arguments  # the request itself is left as sent


@pytest.mark.parametrize(
    "calls", [["not an object"], [{"type": "retrieval", "function": {"name": "f"}}], [{"id": "c"}], {"a": 1}]
)
def test_calls_vllm_refuses_are_not_rendered(calls: Any) -> None:
    with pytest.raises(ValueError, match="vLLM refuses"):
        template_message({"role": "assistant", "content": "", "tool_calls": calls}, "string")


def _dumped(tool: dict[str, Any] | None = None, **function: Any) -> list[dict[str, Any]]:
    """One tool ``w`` as vLLM dumps it, with ``function``'s fields after its three and ``tool``'s after it."""
    return [{"type": "function", "function": {"name": "w", "description": None, "parameters": None, **function}}
            | (tool or {})]  # fmt: skip


W = [{"type": "function", "function": {"name": "w"}}]


@pytest.mark.parametrize(
    ("tools", "tool_choice", "exclude", "dumped"),
    [
        (None, None, False, None),
        (W, None, False, _dumped()),
        (
            [{"function": {"parameters": {"b": 1, "a": 2}, "name": "w", "x-extra": 1}, "extra": True}],
            "auto",
            False,
            _dumped(parameters={"b": 1, "a": 2}),  # unknown keys dropped, the parameters as given
        ),
        (
            [{"type": "function", "function": {"name": "w", "strict": False}, "defer_loading": True}],
            None,
            False,
            _dumped({"defer_loading": True}, strict=False, defer_loading=True),  # the tool's, copied down
        ),
        (
            [{"type": "function", "function": {"name": "w", "defer_loading": False}, "defer_loading": True}],
            None,
            False,
            _dumped({"defer_loading": True}, defer_loading=False),  # the function's own wins
        ),
        (W, "none", True, None),
        (W, "none", False, _dumped()),  # vLLM's default keeps them
    ],
)
def test_tools_are_dumped_as_vllms_request_model_dumps_them(
    tools: Any, tool_choice: Any, exclude: bool, dumped: list[dict[str, Any]] | None
) -> None:
    assert template_tools(tools, tool_choice, exclude_when_choice_none=exclude) == dumped
    if dumped:  # the key order a template's tojson prints
        assert [list(tool["function"]) for tool in dumped] == [
            list(t["function"]) for t in template_tools(tools)
        ]
        assert list(template_tools(tools)[0]["function"])[:3] == ["name", "description", "parameters"]


@pytest.mark.parametrize(
    "tools",
    [
        "weather",
        [{"type": "retrieval"}],
        [{"type": "function", "function": {"description": "no name"}}],
        [{"type": "function", "function": {"name": "w", "description": 3}}],
        [{"type": "function", "function": {"name": "w", "strict": "yes"}}],
    ],
)
def test_tools_vllm_refuses_are_not_rendered(tools: Any) -> None:
    with pytest.raises(ValueError, match="vLLM"):
        template_tools(tools)


TOOL_TEMPLATE = (
    "{% if tools is not none %}{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
)


def _tool_model(directory: Path, source: Path) -> Path:
    (directory / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": TOOL_TEMPLATE}))
    return directory


def test_a_tool_chat_is_counted_as_vllm_renders_it(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    counter = load_counter(str(_tool_model(tmp_path, model_dir)))
    body = {
        "messages": [
            {"role": "user", "content": "the KV cache"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
        ],
        "tools": [{"type": "function", "function": {"name": "w"}}],
        "add_generation_prompt": False,
    }
    text = (
        '{"type": "function", "function": {"name": "w", "description": null, "parameters": null}}\n'
        "<|im_start|>user\nthe KV cache<|im_end|>\n"
        '<|im_start|>assistant\n{"city": "Paris"}<|im_end|>\n'
    )
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    facts = request_facts("/v1/chat/completions", body, counter)
    assert facts.exact
    assert facts.prompts == (len(tokenizer.encode(text, add_special_tokens=False).ids),)


def test_tool_choice_none_renders_no_tools_where_vllm_is_told_so(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    directory = _tool_model(tmp_path, model_dir)
    body = {
        "messages": [{"role": "user", "content": "the KV cache"}],
        "tools": [{"type": "function", "function": {"name": "w"}}],
        "tool_choice": "none",
    }
    kept = request_facts("/v1/chat/completions", body, load_counter(str(directory)))
    excluded = load_counter(str(directory), EngineChat(exclude_tools_when_tool_choice_none=True))
    dropped = request_facts("/v1/chat/completions", body, excluded)
    plain = request_facts("/v1/chat/completions", {**body, "tools": None}, excluded)
    assert kept.exact
    assert dropped.exact
    assert dropped.prompts == plain.prompts
    assert kept.prompts[0] > dropped.prompts[0]


def test_a_tool_vllm_refuses_falls_back_to_the_estimate_with_the_tools_text(
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
) -> None:
    counter = load_counter(str(_tool_model(tmp_path, model_dir)))
    messages = [{"role": "user", "content": "the KV cache"}]
    bad = [{"type": "function", "function": {"description": "a long description without any name " * 4}}]
    facts = request_facts("/v1/chat/completions", {"messages": messages, "tools": bad}, counter)
    bare = request_facts("/v1/chat/completions", {"messages": messages}, counter)
    assert not facts.exact  # never a 400 on it: vLLM gives its own answer
    assert facts.prompts[0] > bare.prompts[0] + 30


def test_the_chat_template_flag_reads_a_file_or_a_template_as_vllm_does(tmp_path: Path) -> None:
    path = tmp_path / "tool.jinja"
    path.write_text(TOOL_TEMPLATE)
    assert read_chat_template(str(path)) == TOOL_TEMPLATE
    assert read_chat_template("{{ messages }}") == "{{ messages }}"  # braces: the template itself
    with pytest.raises(UsageError, match="neither a readable file nor a template"):
        read_chat_template("tool_chat_template_llama3.1_json")  # one of vLLM's built-in names, unknown here
    args = build_parser().parse_args(
        ["run", "--upstream", "http://127.0.0.1:8000", "--chat-template", str(path),
         "--chat-template-content-format", "openai", "--exclude-tools-when-tool-choice-none",
         "--default-chat-template-kwargs", '{"enable_thinking": false}']
    )  # fmt: skip
    assert (args.chat_template, args.chat_template_content_format) == (str(path), "openai")
    assert args.exclude_tools_when_tool_choice_none
    assert args.default_chat_template_kwargs == {"enable_thinking": False}
    for bad in ("[1]", "enable_thinking=false"):
        with pytest.raises(UsageError, match="is not a JSON object"):
            json_object(bad)


def test_the_template_vllm_is_told_replaces_the_models(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    body = {"messages": [{"role": "user", "content": "the KV cache"}], "add_generation_prompt": False}
    told = load_counter(
        str(model_dir), EngineChat(template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    )
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    expected = len(tokenizer.encode("the KV cache", add_special_tokens=False).ids)
    assert request_facts("/v1/chat/completions", body, told).prompts == (expected,)
    assert request_facts("/v1/chat/completions", body, load_counter(str(model_dir))).prompts[0] > expected


def test_responses_tools_render_as_the_chat_tools_vllm_makes_of_them(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    """``construct_tool_dicts``: functions as chat tools, a namespace's named ``namespace__name``, a custom tool
    as a one-string function, other types dropped (they were estimated here until 2026-12-07)."""
    counter = load_counter(str(_tool_model(tmp_path, model_dir)))
    weather = {"name": "weather", "parameters": {"type": "object"}}
    tools = [
        {"type": "function", **weather},
        {
            "type": "namespace",
            "name": "geo",
            "description": "maps",
            "tools": [{"type": "function", **weather}],
        },
        {"type": "web_search"},
    ]
    chat_tools = [
        {"type": "function", "function": weather},
        {"type": "function", "function": {**weather, "name": "geo__weather"}},
    ]
    responses = request_facts("/v1/responses", {"input": "the KV cache", "tools": tools}, counter)
    chat = request_facts(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "the KV cache"}], "tools": chat_tools},
        counter,
    )
    assert (responses.prompts, responses.exact) == (chat.prompts, True)
    refused = request_facts(
        "/v1/responses", {"input": "the KV cache", "tools": [{"type": "function"}]}, counter
    )
    assert not refused.exact  # a function without a name: vLLM refuses it, the sidecar estimates


@pytest.mark.parametrize(
    ("defaults", "variables", "merged"),
    [
        ({}, {"a": None}, {}),  # vLLM always merges (its own defaults hold tokenize): None sets nothing
        ({"a": 1}, {}, {"a": 1}),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": 1}, {"a": None}, {"a": 1}),  # None and "auto" leave the default
        ({"a": 1}, {"a": "auto"}, {"a": 1}),
        ({"a": 1}, {"a": False, "b": "x"}, {"a": False, "b": "x"}),
    ],
)
def test_server_defaults_sit_under_what_a_request_sets(
    defaults: dict[str, Any], variables: dict[str, Any], merged: dict[str, Any]
) -> None:
    assert with_defaults(defaults, variables) == merged


def test_the_server_defaults_reach_the_template(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    template = (
        "{% if greeting %}{{ greeting }} {% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    counter = load_counter(
        str(model_dir), EngineChat(template=template, default_template_kwargs={"greeting": "the KV"})
    )
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "cache"}]}
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    def tokens(text: str) -> tuple[int]:
        return (len(tokenizer.encode(text, add_special_tokens=False).ids),)

    assert request_facts("/v1/chat/completions", body, counter).prompts == tokens("the KV cache")
    unset = {**body, "chat_template_kwargs": {"greeting": None}}
    assert request_facts("/v1/chat/completions", unset, counter).prompts == tokens("the KV cache")
    own = {**body, "chat_template_kwargs": {"greeting": "every"}}
    assert request_facts("/v1/chat/completions", own, counter).prompts == tokens("every cache")
