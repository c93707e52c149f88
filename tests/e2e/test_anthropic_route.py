"""The Anthropic Messages API on the real engine: admitted, counted near vLLM's count, refused as vLLM refuses.

vLLM 0.32.0 serves ``POST /v1/messages`` by default (``vllm/entrypoints/anthropic``), and clients such as
Claude Code use it against local models. The sidecar forwarded it without admission until 2026-12-05.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.admission.body import request_facts
from tests.e2e.spikes import admission_status, start_beside
from tests.e2e.test_real_vllm import admission_totals
from tests.harness.spike import wait_idle
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e
ROUTE = "/v1/messages"
SAMPLES = "kv_sidecar_output_length_samples_total"
BODY = {
    "model": "tiny",
    "max_tokens": 24,
    "system": [{"type": "text", "text": "The key-value cache "}, {"type": "text", "text": "grows."}],
    "messages": [
        {"role": "user", "content": "When the pool of cache blocks runs out, what happens?"},
        {"role": "assistant", "content": [{"type": "text", "text": "The scheduler queues new work."}]},
        {"role": "user", "content": "And then?"},
    ],
}


async def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], str | None]:
    """Status, JSON answer (or the last stream event's data) and the sidecar's reason header."""
    async with aiohttp.ClientSession() as session, session.post(url + ROUTE, json=body) as response:
        text = await response.text()
        reason = response.headers.get("X-KV-Sidecar-Reason")
    if body.get("stream"):
        datas = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
        usage = next(json.loads(d)["usage"] for d in reversed(datas) if '"usage"' in d)
        return response.status, {"usage": usage}, reason
    return response.status, json.loads(text), reason


async def test_messages_are_admitted_counted_and_learned(vllm_server: VllmServer, tiny_model: Path) -> None:
    await wait_idle(vllm_server.url)
    status, straight, _ = await post(vllm_server.url, BODY)
    assert status == 200, straight
    app = await start_beside(vllm_server.url, tiny_model, tokenizer_model=str(tiny_model))
    proxy = f"http://127.0.0.1:{app.proxy_port}"
    assert app.proxy is not None
    try:
        counted = request_facts(ROUTE, BODY, app.proxy.counter).prompts[0]
        print(f"\nsidecar's count {counted}, vLLM's usage.input_tokens {straight['usage']['input_tokens']}")
        assert counted == straight["usage"]["input_tokens"]  # the conversion, rendered: near, here equal
        status, answer, _ = await post(proxy, BODY)
        assert status == 200, answer
        assert answer["usage"]["input_tokens"] == counted
        status, streamed, _ = await post(proxy, {**BODY, "stream": True})
        assert (status, streamed["usage"]["input_tokens"]) == (200, counted)
        assert sum(v for (outcome, _, _), v in admission_totals(app).items() if outcome == "admitted") == 2
        assert app.registry.get_sample_value(SAMPLES, {"source": "usage"}) == 2  # never the stream's events
        bounds = (await admission_status(app))["output_bounds"]
        assert [b["samples"] for b in bounds if b["route"] == ROUTE] == [2]  # type: ignore[index]
        status, refused, reason = await post(proxy, {**BODY, "max_tokens": 5000})
        straight_status, straight_refusal, _ = await post(vllm_server.url, {**BODY, "max_tokens": 5000})
        assert (status, reason, straight_status) == (400, "context-length-exceeded", 400)
        assert refused["type"] == straight_refusal["type"] == "error"  # the shape vLLM answers there
        assert set(refused["error"]) >= {"type", "message"}
    finally:
        await app.drain()
        await app.stop()
