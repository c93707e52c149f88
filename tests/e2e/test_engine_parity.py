"""Refuse exactly what vLLM refuses: every recorded case sent straight and through the sidecar, both live.

What vLLM serves, the sidecar forwards (same status); what vLLM always refuses for length the sidecar
refuses itself (its own ``X-KV-Sidecar-Reason``, the engine never sees it); everything else vLLM refuses
(bad values) is left to vLLM, whose own answer comes back. Chat prompts are counted with the model's
template: the sidecar's count equals vLLM's ``usage.prompt_tokens``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.tokens import load_counter
from tests.e2e.spikes import admission_status
from tests.e2e.test_real_vllm import start
from tests.harness.spike import wait_idle
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e

CASES = json.loads((Path(__file__).parents[1] / "data" / "vllm" / "parity-cases-0.32.0.json").read_text())


def _body(case: dict[str, Any]) -> dict[str, Any]:
    body = dict(case["body"])
    if "prompt_ids" in body:
        body["prompt"] = [5] * body.pop("prompt_ids")
    if "input_repeat" in body:  # a Responses input of about four tokens a repeat (the tiny model's tokenizer)
        body["input"] = "the kv cache grows " * body.pop("input_repeat")
    return body


def _sidecar_must_refuse(body: dict[str, Any], path: str) -> bool:
    """The length refusals the sidecar answers itself (exact counts: token ids, or the tiny model's tokenizer)."""
    if path.endswith("/chat/completions"):
        bound = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        bound = body.get("max_tokens")
    return isinstance(bound, int) and not isinstance(bound, bool) and bound > 1024


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, str | None, Any]:
    async with session.post(url, json=body) as response:
        payload = await response.json(content_type=None)
        return response.status, response.headers.get("X-KV-Sidecar-Reason"), payload


async def test_the_sidecar_refuses_exactly_what_vllm_refuses(
    vllm_server: VllmServer, tiny_model: Path
) -> None:
    await wait_idle(vllm_server.url)
    app = await start(vllm_server.url, tiny_model, tokenizer_model=str(tiny_model))
    proxy = f"http://127.0.0.1:{app.proxy_port}"
    mismatches, refused_here = [], []
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while app.monitor.request_max_model_len() != 1024:  # read from vLLM's /v1/models
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as session:
            for case in CASES:
                body = _body(case)
                direct, _, _ = await _post(session, vllm_server.url + case["path"], body)
                through, reason, _ = await _post(session, proxy + case["path"], body)
                if (direct, through) != (case["expected_status"], case["expected_status"]):
                    mismatches.append((case["name"], case["expected_status"], direct, through))
                if reason is not None:  # the sidecar answered itself: only where vLLM refuses too
                    refused_here.append(case["name"])
                    assert direct == through == 400, case["name"]
                    assert reason in {"context-length-exceeded", "invalid-request"}, case["name"]
                if direct == 200:
                    assert reason is None, f"{case['name']}: vLLM serves it, the sidecar refused it"
                if _sidecar_must_refuse(body, case["path"]):
                    assert reason is not None, f"{case['name']}: vLLM always refuses it; it reached vLLM"
    finally:
        await app.drain()
        await app.stop()
    assert not mismatches, mismatches
    assert len(refused_here) >= 10  # every max_tokens > max_model_len and prompt >= max_model_len case
    print(f"\n{len(CASES)} cases agree; refused by the sidecar itself: {sorted(refused_here)}")


async def test_chat_counts_equal_vllms_usage(vllm_server: VllmServer, tiny_model: Path) -> None:
    counter = load_counter(str(tiny_model))
    assert counter.exact
    chats = [
        [{"role": "user", "content": "hi there"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the KV cache grows"}],
        [{"role": "user", "content": "一张显存足够装下模型权重的显卡"}, {"role": "assistant", "content": "ok"},
         {"role": "user", "content": [{"type": "text", "text": "def plan(model, gpu): return ledger"}]}],
    ]  # fmt: skip
    prefill = [*chats[1], {"role": "assistant", "content": "The blocks run out and"}]  # continued, left open
    options: list[dict[str, object]] = [{}] * len(chats) + [
        {"continue_final_message": True, "add_generation_prompt": False},
        {"chat_template_kwargs": {"add_generation_prompt": False}},  # the request's field wins over its copy
        {
            "add_generation_prompt": False,
            "reasoning_effort": "low",
            "documents": [{"title": "t", "text": "x"}],
        },
        {"chat_template_kwargs": {"continue_final_message": True}},  # the request's default False wins too
    ]
    async with aiohttp.ClientSession() as session:
        for messages, extra in zip([*chats, prefill, *chats[1:3], prefill], options, strict=True):
            body = {"model": "tiny", "messages": messages, "max_tokens": 1, **extra}
            status, _, payload = await _post(session, vllm_server.url + "/v1/chat/completions", body)
            assert status == 200, extra
            facts = request_facts("/v1/chat/completions", body, counter)
            assert facts.exact
            assert facts.prompts == (payload["usage"]["prompt_tokens"],), extra


CALL = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}
ASKED = {"role": "user", "content": "what is the weather"}
TOOL_CHATS: dict[str, dict[str, Any]] = {  # vLLM rebuilds these before its template prints them
    "a tool with a name only": {"messages": [ASKED], "tools": [{"type": "function", "function": {"name": "w"}}]},
    "a reordered tool with unknown keys": {
        "messages": [ASKED],
        "tools": [
            {
                "function": {"parameters": {"type": "object"}, "name": "w", "description": "d", "x-extra": 1},
                "type": "function",
                "extra": True,
            }
        ],
    },
    "strict set": {"messages": [ASKED], "tools": [{"type": "function", "function": {"name": "w", "strict": False}}]},
    "a call's arguments as a JSON string": {
        "messages": [ASKED, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                     {"role": "tool", "tool_call_id": "c1", "content": "22C"}],
    },
    "arguments that are not JSON": {
        "messages": [ASKED, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "not json"}}]}, ASKED],
    },
    "a tool result in parts": {
        "messages": [ASKED, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                     {"role": "tool", "tool_call_id": "c1",
                      "content": [{"type": "text", "text": "22C"}, {"type": "text", "text": "sunny"}]}],
    },
    "empty tool_calls": {"messages": [ASKED, {"role": "assistant", "content": "ok", "tool_calls": []}, ASKED]},
    "a name and an unknown key": {"messages": [{"role": "user", "content": "hi", "name": "bob", "weight": 2}]},
    "reasoning": {"messages": [ASKED, {"role": "assistant", "content": "ok", "reasoning": "hmm"}, ASKED]},
    "reasoning_content": {"messages": [ASKED, {"role": "assistant", "content": "ok", "reasoning_content": "hmm"}]},
    "a billing header": {
        "messages": [{"role": "system", "content": "x-anthropic-billing-header: cch=12\nbe brief"}, ASKED],
    },
    # developer messages: system ones, merged at the front, for a template without the role (vLLM >= 0.26)
    "a developer message first": {"messages": [{"role": "developer", "content": "be terse"}, ASKED]},
    "a system then a developer message": {
        "messages": [{"role": "system", "content": "sys one"}, {"role": "developer", "content": "dev two"}, ASKED],
    },
    "a late developer message in parts": {
        "messages": [ASKED, {"role": "assistant", "content": "ok"},
                     {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                     ASKED],
    },
    "an empty developer message": {
        "messages": [{"role": "developer", "content": ""}, {"role": "system", "content": "s"}, ASKED],
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TOOL_CHATS))
async def test_tool_chats_count_as_vllm_renders_them(
    vllm_server: VllmServer, tiny_model: Path, name: str
) -> None:
    """Tools, calls and messages as vLLM rebuilds them (:mod:`sidecar.admission.conversation`).

    The tiny model's template prints tools and calls as tool-calling templates do; the server runs without
    a tool parser, so tools go with ``tool_choice`` ``"none"`` (without it vLLM refuses before rendering).
    """
    counter = load_counter(str(tiny_model))
    body = {"model": "tiny", "max_tokens": 1, **TOOL_CHATS[name]}
    if "tools" in body:
        body["tool_choice"] = "none"
    async with aiohttp.ClientSession() as session:
        status, _, payload = await _post(session, vllm_server.url + "/v1/chat/completions", body)
    assert status == 200, payload
    facts = request_facts("/v1/chat/completions", body, counter)
    assert facts.exact
    assert facts.prompts == (payload["usage"]["prompt_tokens"],)


async def test_a_template_vllm_does_not_render_never_refuses_what_vllm_serves(
    vllm_server: VllmServer, tiny_model: Path, tmp_path: Path
) -> None:
    """The sidecar told another template than vLLM's (vLLM run with ``--chat-template``, say).

    Its "exact" chat counts run 40-odd tokens above vLLM's. Before a refusal for length it asks vLLM's
    ``/tokenize`` (:mod:`sidecar.admission.recount`): a chat vLLM serves is served from the first request (it
    was refused 400 until an answer's usage disagreed), and one vLLM counts too long is refused on vLLM's
    count without reaching the engine. The disagreement ends the route's trust in the sidecar's own counts.
    """
    model = tmp_path / "other-template"
    shutil.copytree(tiny_model, model)
    template = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").write_text(
        "<|im_start|>system\n" + "be brief " * 20 + "<|im_end|>\n" + template
    )
    vllms, sidecars = load_counter(str(tiny_model)), load_counter(str(model))  # vLLM's template, another

    def chat(words: int) -> tuple[dict[str, Any], int, int]:
        """A chat of ``words`` words: its body, vLLM's count and the sidecar's."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hello " * words}]
        body = {"model": "tiny", "messages": messages, "max_tokens": 1}
        served = len(vllms.chat_tokens(messages) or [])
        return body, served, request_facts("/v1/chat/completions", body, sidecars).prompts[0]

    words = next(w for w in range(1, 2000) if chat(w + 1)[1] >= 1015)  # the longest chat below 1,015
    fits, served, counted = chat(words)
    assert served < 1024 <= counted  # vLLM serves it; the sidecar's own count says it cannot fit
    too_long, too_long_served, _ = chat(words + 20)
    assert too_long_served >= 1024
    await wait_idle(vllm_server.url)
    app = await start(vllm_server.url, tiny_model, tokenizer_model=str(model))
    proxy = f"http://127.0.0.1:{app.proxy_port}"
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while app.monitor.request_max_model_len() != 1024:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as session:
            status, reason, payload = await _post(session, proxy + "/v1/chat/completions", fits)
            assert (status, reason) == (200, None), payload  # the first request: vLLM's count decided
            assert payload["usage"]["prompt_tokens"] == served
            status, reason, payload = await _post(session, proxy + "/v1/chat/completions", too_long)
            assert (status, reason) == (400, "context-length-exceeded")  # answered here, not by vLLM
            assert f"has {too_long_served}" in payload["error"]["message"]  # vLLM's count
        checks = (await admission_status(app))["prompt_count_checks"]
        assert isinstance(checks, dict)
        assert checks["recounts"] == {"refused": 1, "served": 1, "unanswered": 0}
        assert checks["disagree"] >= 1
        assert [(d["route"], d["counted"], d["vllm"]) for d in checks["distrusted"]] == [
            ("/v1/chat/completions", counted, served)
        ]
    finally:
        await app.drain()
        await app.stop()


async def test_responses_counts_equal_vllms_usage(vllm_server: VllmServer, tiny_model: Path) -> None:
    """The Responses API's ``instructions`` lead as a system message (``construct_input_messages``)."""
    counter = load_counter(str(tiny_model))
    bodies: list[dict[str, Any]] = [
        {"input": "the KV cache grows"},
        {"input": "the KV cache grows", "instructions": "be brief"},
        {
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi there"}]}],
            "instructions": "x",
        },
    ]
    async with aiohttp.ClientSession() as session:
        for extra in bodies:
            body = {"model": "tiny", "max_output_tokens": 1, **extra}
            status, _, payload = await _post(session, vllm_server.url + "/v1/responses", body)
            assert status == 200, extra
            facts = request_facts("/v1/responses", body, counter)
            assert facts.exact
            assert facts.prompts == (payload["usage"]["input_tokens"],), extra
