"""The sidecar in front of each engine of the model-server protocol (a fake serving that engine's recorded page)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.monitor.scraper import ScrapeSettings
from sidecar.server.gateway import KV_USAGE, QUEUED, RUNNING
from sidecar.signals.engines import parse_engine_metrics
from sidecar.signals.kinds import EngineKind
from tests.fake_vllm import FakeVllm
from tests.integration.conftest import INTERVAL, RunningSidecar, start_sidecar
from tests.integration.test_gateway import proxy_series

pytestmark = pytest.mark.integration

PAGES = Path(__file__).parents[1] / "data" / "engines"

CASES = [
    # page, served as trtllm-serve does (JSON /metrics), expected engine, expected admission policy
    pytest.param("sglang-0.4.1-docs-production-metrics.prom", False, EngineKind.SGLANG, "lanes", id="sglang-0.4"),
    pytest.param("sglang-0.5.23-SYNTHESIZED-from-source.prom", False, EngineKind.SGLANG, "capacity", id="sglang-0.5"),
    pytest.param("triton-trtllm-v0.21.0-readme.prom", False, EngineKind.TRITON_TENSORRT_LLM, "capacity", id="triton"),
    pytest.param("trtllm-serve-050f80de-collector-run.prom", True, EngineKind.TRTLLM_SERVE, "capacity", id="trtllm"),
]  # fmt: skip


async def status(sidecar: RunningSidecar) -> dict[str, Any]:
    return (await sidecar.get("/status")).json()  # type: ignore[no-any-return]


@pytest.mark.parametrize(("name", "json_metrics", "kind", "policy"), CASES)
async def test_the_sidecar_reads_and_admits_on_every_engine(
    fake_vllm: FakeVllm, name: str, json_metrics: bool, kind: EngineKind, policy: str
) -> None:
    text = (PAGES / name).read_text()
    fake_vllm.state.metrics_page = text
    fake_vllm.state.json_metrics = json_metrics
    engine = parse_engine_metrics(text)
    sidecar = await start_sidecar(fake_vllm.url, proxy=True)
    try:
        for _ in range(100):
            document = await status(sidecar)
            if document["engine"]["kind"] == kind.value:
                break
            await asyncio.sleep(INTERVAL)
        assert document["engine"]["kind"] == kind.value
        assert document["engine"]["up"] is True
        assert (await sidecar.get("/readyz")).status_code == 200
        assert document["admission"]["policy"]["effective"] == policy
        if policy != "capacity":
            assert kind.value in document["admission"]["policy"]["fallback"]  # says why, naming the engine
        async with aiohttp.ClientSession() as session:
            body = {"model": "tiny", "prompt": list(range(20)), "max_tokens": 8}
            for _ in range(3):
                async with session.post(sidecar.proxy + "/v1/completions", json=body) as response:
                    assert response.status == 200
        assert fake_vllm.state.generation_requests == 3
        series = await proxy_series(sidecar)  # the gateway view, from this engine's figures
        assert series[QUEUED] == (engine.waiting or 0.0)
        assert series[RUNNING] == engine.running
        assert series[KV_USAGE] == pytest.approx(engine.kv_usage or 0.0)
    finally:
        await sidecar.app.stop()


async def test_a_metrics_page_on_another_port_is_read_with_engine_metrics(fake_vllm: FakeVllm) -> None:
    """Triton serves metrics on its own port (8002): --engine-metrics names the page's URL."""
    metrics = FakeVllm()
    metrics.state.metrics_page = (PAGES / "triton-trtllm-v0.21.0-readme.prom").read_text()
    await metrics.start()
    fake_vllm.state.metrics_page = "# nothing here\n"
    sidecar = await start_sidecar(
        fake_vllm.url,
        proxy=True,
        scrape=ScrapeSettings(
            interval=INTERVAL,
            timeout=0.5,
            max_backoff=0.2,
            engine=EngineKind.TRITON_TENSORRT_LLM,
            metrics_url=metrics.url + "/metrics",
        ),
    )
    try:
        await asyncio.sleep(4 * INTERVAL)
        document = await status(sidecar)
        assert document["engine"]["kind"] == "triton-tensorrt-llm"
        assert document["engine"]["kv_cache_usage_ratio"] == pytest.approx(0.4875)
        assert fake_vllm.state.metrics_requests == 0
    finally:
        await sidecar.app.stop()
        await metrics.stop()
