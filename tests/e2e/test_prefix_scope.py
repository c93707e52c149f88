"""vLLM shares prompt blocks only within a ``cache_salt``: checked on the real engine, and the ledger agrees.

vLLM 0.32.0 keys each prompt block by the request's extra keys too (``generate_block_hash_extra_keys`` in
``vllm/v1/core/kv_cache_utils.py``: the LoRA adapter, media, and the ``cache_salt`` on the first block, so on
the whole chain). The sidecar counted two requests with the same token ids as sharing their blocks whatever
their salts, so it planned a second salted request a block where vLLM allocates five.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from sidecar.admission.body import request_facts
from sidecar.signals import parse_vllm_metrics
from tests.e2e.spikes import start_beside
from tests.harness.admission_suite import reset_prefix_cache
from tests.harness.spike import wait_idle
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e
PROMPT = [20 + i % 400 for i in range(600)]  # 600 token ids (vocabulary 512): 4 full blocks can be shared


async def hits(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as response:
        return parse_vllm_metrics(await response.text()).prefix_cache_hits_total or 0.0


async def test_only_requests_of_one_cache_salt_share_prompt_blocks(
    vllm_server: VllmServer, tiny_model: Path
) -> None:
    url = vllm_server.url
    await wait_idle(url)
    assert await reset_prefix_cache(url)
    seen = []
    async with aiohttp.ClientSession() as session:
        for salt in ("a", "b", "a"):
            before = await hits(session, url)
            body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "cache_salt": salt}
            async with session.post(url + "/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
            seen.append(await hits(session, url) - before)
    assert seen == [0, 0, 4 * 128]  # salt b hit nothing that salt a left; a again hit its four blocks
    app = await start_beside(url, tiny_model)
    try:
        planner = app.controller.planner
        facts = [
            request_facts(
                "/v1/completions", {"prompt": PROMPT, "model": "tiny", "cache_salt": s}, app.proxy.counter
            )  # type: ignore[union-attr]
            for s in ("a", "b")
        ]
        planner.hold(facts[0], planner.hashes(facts[0]), 0.0, in_ledger=True)
        assert planner.added_blocks(facts[0], planner.hashes(facts[0])) == 1  # 5 blocks, 4 held: as vLLM
        assert planner.added_blocks(facts[1], planner.hashes(facts[1])) == 5  # another salt: nothing shared
    finally:
        await app.stop()
