"""The sidecar scrapes vLLM at its calm interval while KV usage is low and nothing waits for blocks."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.admission.decide import AdmissionConfig, AdmissionMode
from sidecar.monitor.scraper import ScrapeSettings
from tests.fake_vllm import FakeVllm
from tests.integration.conftest import start_sidecar

SETTINGS = ScrapeSettings(interval=0.05, calm_interval=0.4, timeout=0.5, max_backoff=0.2)


async def _pages_in(fake: FakeVllm, seconds: float) -> int:
    before = fake.state.metrics_requests
    await asyncio.sleep(seconds)
    return fake.state.metrics_requests - before


async def test_low_usage_is_scraped_at_the_calm_interval_and_high_usage_at_the_interval(
    fake_vllm: FakeVllm,
) -> None:
    fake_vllm.state.set_kv_usage(0.0)  # idle: nothing in use that the sidecar's ledger cannot explain
    running = await start_sidecar(fake_vllm.url, scrape=SETTINGS)
    try:
        await asyncio.sleep(0.2)  # the first round has read the low usage
        calm = await _pages_in(fake_vllm, 1.2)
        calm_status = (await running.get("/status")).json()["engine"]
        fake_vllm.state.set_kv_usage(0.9)  # above the release threshold (0.80): pages matter again
        await asyncio.sleep(0.5)  # the next calm round reads it
        busy = await _pages_in(fake_vllm, 1.0)
        busy_status = (await running.get("/status")).json()["engine"]
    finally:
        await running.app.stop()
    assert calm_status["next_scrape_after_seconds"] == SETTINGS.calm_interval
    assert busy_status["next_scrape_after_seconds"] == SETTINGS.interval
    assert calm <= 4  # every 0.4 s, where the interval would have asked ~24 times
    assert busy >= 8  # every 0.05 s (slack for a loaded CI machine)


@pytest.mark.parametrize(
    ("usage", "mode"),
    [
        (0.0, AdmissionMode.LANES),  # nothing plans the pool, so nothing says usage will not climb
        (0.3, AdmissionMode.CAPACITY),  # in use, yet the sidecar admitted nothing: a client bypassing it
    ],
)
async def test_the_interval_is_kept_where_usage_could_climb_unseen(
    fake_vllm: FakeVllm, usage: float, mode: AdmissionMode
) -> None:
    fake_vllm.state.set_kv_usage(usage)
    running = await start_sidecar(fake_vllm.url, scrape=SETTINGS, admission=AdmissionConfig(mode=mode))
    try:
        await asyncio.sleep(0.2)
        pages = await _pages_in(fake_vllm, 1.0)
    finally:
        await running.app.stop()
    assert pages >= 8
