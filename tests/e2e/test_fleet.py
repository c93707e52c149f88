"""Two real vLLM servers, each behind its own sidecar: a gateway sees a spike on the replica it hit, only there."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.app import SidecarApp
from sidecar.server.gateway import KV_USAGE, QUEUED, RUNNING
from tests.e2e.conftest import serve
from tests.e2e.test_real_vllm import start
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e

POLL = 0.05  # the endpoint picker's refresh interval


@pytest.fixture(scope="module")
def second_server(
    vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """Another vLLM like the session's (16 blocks of 128, 4 sequences), for a two-replica fleet."""
    yield from serve(vllm_env, tiny_model, tmp_path_factory, "vllm-b.log")


async def gateway_view(session: aiohttp.ClientSession, app: SidecarApp) -> dict[str, float]:
    """What an endpoint picker reads from the replica's traffic port."""
    async with session.get(f"http://127.0.0.1:{app.proxy_port}/metrics") as response:
        text = await response.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in {QUEUED, RUNNING, KV_USAGE}
    }


async def test_a_spike_on_one_replica_shows_in_its_adjusted_queue_and_not_the_others(
    vllm_server: VllmServer, second_server: VllmServer, tiny_model: Path
) -> None:
    replica_a = await start(vllm_server.url, tiny_model)
    replica_b = await start(second_server.url, tiny_model)
    rng = random.Random()  # noqa: S311 - fresh prompts on every run: nothing rides on a previous run's cached blocks
    try:
        async with aiohttp.ClientSession() as session:
            await asyncio.sleep(0.5)  # both sidecars have scraped their engine
            assert (await gateway_view(session, replica_a))[QUEUED] == 0
            url = f"http://127.0.0.1:{replica_a.proxy_port}/v1/completions"

            async def one() -> int:
                prompt = [rng.randrange(1, 500) for _ in range(300)]
                body = {"model": "tiny", "prompt": prompt, "max_tokens": 200, "ignore_eos": True}
                async with session.post(url, json=body) as response:
                    await response.read()
                    return response.status

            sent = time.monotonic()
            spike = [asyncio.create_task(one()) for _ in range(12)]
            seen_at = None
            peak_a = 0.0
            peak_b = {QUEUED: 0.0, RUNNING: 0.0, KV_USAGE: 0.0}
            while not all(task.done() for task in spike):
                view_a, view_b = (
                    await gateway_view(session, replica_a),
                    await gateway_view(session, replica_b),
                )
                peak_a = max(peak_a, view_a[QUEUED])
                if seen_at is None and view_a[QUEUED] >= 4:
                    seen_at = time.monotonic() - sent
                peak_b = {name: max(peak_b[name], view_b[name]) for name in peak_b}
                await asyncio.sleep(POLL)
            statuses = [task.result() for task in spike]
            assert statuses == [200] * 12  # nothing lost
            assert seen_at is not None, f"replica A's adjusted queue peaked at {peak_a}"
            assert seen_at < 0.5, f"the gateway saw replica A's queue {seen_at:.2f}s after the spike"
            assert peak_b == {QUEUED: 0.0, RUNNING: 0.0, KV_USAGE: 0.0}  # the other replica looks idle
            await asyncio.sleep(0.3)
            assert (await gateway_view(session, replica_a))[
                QUEUED
            ] == 0  # and the queue leaves with the spike
    finally:
        for app in (replica_a, replica_b):
            await app.drain()
            await app.stop()
