"""A request's ``stream_interval`` on the real engine: fewer events than tokens, and nothing learned from them.

vLLM 0.32 holds a stream's events back until ``stream_interval`` tokens have come (the first token and the
end excepted: ``RequestState.make_request_output``, ``vllm/v1/engine/output_processor.py``). Through the
sidecar, a usage-less stream's events were counted as its tokens and taught an answer length several times
too short; now such a stream teaches nothing, and one at the default interval still does.
"""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.spikes import start_beside
from tests.harness.spike import wait_idle
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e

SAMPLES = "kv_sidecar_output_length_samples_total"
BODY = {"model": "tiny", "prompt": [11, 12, 13], "max_tokens": 64, "stream": True}


async def events(url: str, body: dict[str, object]) -> tuple[int, int | None]:
    """Token-bearing events of a streamed completion, and its ``usage.completion_tokens`` when asked for."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body) as response,
    ):
        assert response.status == 200, await response.text()
        payload = (await response.read()).decode()
    chunks = [
        json.loads(line.removeprefix("data: "))
        for line in payload.split("\n\n")
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    usage = next((c["usage"]["completion_tokens"] for c in chunks if c.get("usage")), None)
    return sum(1 for c in chunks if c["choices"]), usage


async def test_an_interval_of_eight_streams_an_event_per_eight_tokens(vllm_server: VllmServer) -> None:
    await wait_idle(vllm_server.url)
    body = {**BODY, "stream_interval": 8, "stream_options": {"include_usage": True}}
    count, tokens = await events(vllm_server.url, body)
    assert tokens is not None
    assert tokens > 16, "the answer ended too soon to tell"
    assert count <= 2 + (tokens - 1) // 8 < tokens  # the first token alone, then one per 8, and the end
    default, tokens_then = await events(vllm_server.url, {**body, "stream_interval": 1})
    assert tokens_then is not None
    assert default >= tokens_then - 1  # at the default interval, an event a token (two when the reader lags)


async def test_through_the_sidecar_only_a_stream_of_one_token_an_event_teaches(
    vllm_server: VllmServer, tiny_model: Path
) -> None:
    await wait_idle(vllm_server.url)
    app = await start_beside(vllm_server.url, tiny_model)
    proxy = f"http://127.0.0.1:{app.proxy_port}"
    try:
        await events(proxy, {**BODY, "stream_interval": 8})
        assert not app.registry.get_sample_value(SAMPLES, {"source": "stream"})
        assert app.controller.planner.outputs.bound("/v1/completions", "tiny") is None
        await events(proxy, BODY)
        assert app.registry.get_sample_value(SAMPLES, {"source": "stream"}) == 1
        assert app.controller.planner.outputs.bound("/v1/completions", "tiny") is not None
    finally:
        await app.drain()
        await app.stop()
