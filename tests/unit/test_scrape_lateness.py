"""The engine's metrics age counts the engine's time, not the sidecar's own lateness in asking (a busy loop)."""

from __future__ import annotations

import io

import httpx
import pytest

from sidecar.admission.pressure import Staleness
from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.scraper import EngineScraper
from sidecar.settings import ScrapeSettings
from tests.fake_vllm import PRESSURE_PAGE, page


class Recorder:
    def duration(self, seconds: float, page: object) -> None:
        pass

    def error(self, reason: str) -> None:
        pass

    def restart(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("asked_at", "answered_at", "stale"),
    [
        (4.0, 4.1, False),  # due at 0.25, asked 3.75 s late by a busy sidecar: the engine answered in 0.1 s
        (0.25, 4.1, True),  # asked on time, the engine took 3.85 s: its metrics are stale by then
        (0.25, 0.35, False),
    ],
)
async def test_only_the_engines_own_delay_makes_its_metrics_stale(
    asked_at: float, answered_at: float, stale: bool
) -> None:
    clock = Clock()
    monitor = Monitor(PlanInputs(), MonitorSettings(), make_logger(io.StringIO()))
    seen: list[float | None] = []
    text = page(PRESSURE_PAGE)

    async def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics" and clock.now >= asked_at:  # the second round, while it waits
            clock.now = answered_at
            seen.append(monitor.engine.metrics_age(clock.now))
        return httpx.Response(200, text=text if request.url.path == "/metrics" else "{}")

    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        scraper = EngineScraper(
            client, "http://engine", monitor, Recorder(), settings=ScrapeSettings(interval=0.25), clock=clock
        )
        assert await scraper.scrape_once()  # t = 0: the first page
        assert scraper.schedule_next() == 0.25
        clock.now = asked_at
        assert await scraper.scrape_once()
    assert seen[0] is not None
    assert Staleness(after=3.0).is_stale(True, seen[0]) is stale
    assert monitor.engine.own_delay == 0.0  # a good page: the count starts over
