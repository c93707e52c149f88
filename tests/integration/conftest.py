"""Fixtures for integration tests: a fake vLLM and the sidecar, both on real loopback sockets."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar.admission.pressure import StaleMode, Staleness
from sidecar.app import RunOptions, SidecarApp
from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.scraper import ScrapeSettings
from tests.fake_vllm import TINY_CONFIG, FakeVllm

INTERVAL = 0.05
STARTED: list[SidecarApp] = []
"""Every sidecar started by the current test (for end-of-test accounting checks)."""


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    """A model directory holding only the tiny model's config.json (as the real-vLLM fixtures used)."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    return tmp_path


@pytest.fixture
async def fake_vllm() -> AsyncIterator[FakeVllm]:
    """A fake vLLM serving the recorded KV-pressure page."""
    fake = FakeVllm()
    await fake.start()
    yield fake
    await fake.stop()


class RunningSidecar:
    """A started SidecarApp, its captured logs and an HTTP client for its admin port."""

    def __init__(self, app: SidecarApp, logs: io.StringIO) -> None:
        self.app = app
        self._logs = logs
        self.admin = f"http://127.0.0.1:{app.admin_port}"
        self.proxy = f"http://127.0.0.1:{app.proxy_port}" if app.proxy_port else ""

    def logs(self) -> list[dict[str, Any]]:
        """Every JSON log line so far."""
        return [json.loads(line) for line in self._logs.getvalue().splitlines() if line.strip()]

    async def get(self, path: str) -> httpx.Response:
        """GET an admin endpoint."""
        async with httpx.AsyncClient() as client:
            return await client.get(self.admin + path, timeout=5)

    async def metric(self, name: str, **labels: str) -> float | None:
        """One sample of the sidecar's /metrics, or None when absent."""
        from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

        text = (await self.get("/metrics")).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        return None


async def start_sidecar(
    upstream: str,
    inputs: PlanInputs | None = None,
    settings: MonitorSettings | None = None,
    *,
    scrape_timeout: float = 0.5,
    stale_policy: str = "open",
    proxy: bool = False,
    **overrides: Any,
) -> RunningSidecar:
    """Start a sidecar scraping ``upstream`` every 50 ms, admin (and proxy) on ephemeral ports."""
    logs = io.StringIO()
    app = SidecarApp(
        RunOptions(
            upstream=upstream,
            admin_listen=("127.0.0.1", 0),
            listen=("127.0.0.1", 0),
            proxy=proxy,
            scrape=overrides.pop("scrape", None)
            or ScrapeSettings(interval=INTERVAL, timeout=scrape_timeout, max_backoff=0.2),
            nvml=False,
            staleness=Staleness(policy=StaleMode(stale_policy)),
            **overrides,
        ),
        inputs or PlanInputs(),
        settings or MonitorSettings(),
        make_logger(logs),
    )
    await app.start()
    STARTED.append(app)
    return RunningSidecar(app, logs)


@pytest.fixture
async def sidecar(fake_vllm: FakeVllm) -> AsyncIterator[RunningSidecar]:
    """A sidecar in front of the fake vLLM, with no prediction inputs."""
    running = await start_sidecar(fake_vllm.url)
    yield running
    await running.app.stop()
