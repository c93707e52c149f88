"""vLLM 0.32's ``/v1/chat/completions/batch`` through the sidecar: admitted, each conversation a prompt.

The sidecar's counts, one per conversation, add up to vLLM's ``usage.prompt_tokens`` for the batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.admission.body import request_facts
from tests.e2e.spikes import start_beside
from tests.e2e.test_real_vllm import admission_totals
from tests.harness.spike import wait_idle
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e
ROUTE = "/v1/chat/completions/batch"
BODY = {
    "model": "tiny",
    "max_tokens": 5,
    "messages": [
        [{"role": "user", "content": "hello there"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the KV cache grows"}],
        [{"role": "user", "content": "When the pool of cache blocks runs out, what happens?"}],
    ],
}


async def usage(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(url + ROUTE, json=BODY) as response:
        answer = await response.json()
        assert response.status == 200, answer
    assert len(answer["choices"]) == 3
    return dict(answer["usage"])


async def test_a_batch_of_conversations_is_admitted_as_its_prompts(
    vllm_server: VllmServer, tiny_model: Path
) -> None:
    await wait_idle(vllm_server.url)
    straight = await usage(vllm_server.url)
    app = await start_beside(vllm_server.url, tiny_model, tokenizer_model=str(tiny_model))
    assert app.proxy is not None
    try:
        facts = request_facts(ROUTE, BODY, app.proxy.counter)
        assert (facts.exact, len(facts.prompts)) == (True, 3)
        assert sum(facts.prompts) == straight["prompt_tokens"]
        through = await usage(f"http://127.0.0.1:{app.proxy_port}")
        assert through["prompt_tokens"] == straight["prompt_tokens"]
        assert sum(v for (outcome, _, _), v in admission_totals(app).items() if outcome == "admitted") == 1
    finally:
        await app.drain()
        await app.stop()
