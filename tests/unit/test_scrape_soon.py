"""Admission asks the scraper for a round sooner than the interval: soon, but never too often, never while failing."""

from __future__ import annotations

import asyncio
import io
import itertools
import time

import httpx

from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.scraper import SOONEST_SECONDS, EngineScraper
from sidecar.settings import ScrapeSettings
from tests.fake_vllm import PRESSURE_PAGE, page
from tests.unit.test_scrape_lateness import Recorder


async def _rounds(
    *,
    failing: bool = False,
    asks: tuple[float, ...] = (),
    settings: ScrapeSettings | None = None,
    calm_until: float = 0.0,
    over: float = 0.5,
) -> list[float]:
    """When a scraper's rounds asked, over ``over`` s (10 s interval unless ``settings``), with ``scrape_soon``
    asked at ``asks`` and its ``calm`` predicate true until ``calm_until`` s."""
    monitor = Monitor(PlanInputs(), MonitorSettings(), make_logger(io.StringIO()))
    text = page(PRESSURE_PAGE)
    asked: list[float] = []
    start = time.monotonic()

    async def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path in {"/metrics", "/metrics/"}:  # a full round, or a light one (asked for)
            asked.append(time.monotonic() - start)
            return httpx.Response(500 if failing else 200, text=text)
        return httpx.Response(200, text="{}")

    def calm() -> bool:
        return time.monotonic() - start < calm_until

    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        scraper = EngineScraper(
            client, "http://engine", monitor, Recorder(),
            settings=settings or ScrapeSettings(interval=10.0), calm=calm,
        )  # fmt: skip
        task = asyncio.create_task(scraper.run())
        for at in asks:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            scraper.scrape_soon(0.0)
        await asyncio.sleep(max(0.0, start + over - time.monotonic()))
        task.cancel()
    return asked


async def test_a_round_asked_for_comes_before_the_interval() -> None:
    asked = await _rounds(failing=False, asks=(0.2,))
    assert len(asked) == 2
    assert 0.2 <= asked[1] < 0.3


async def test_rounds_asked_for_are_never_closer_than_the_soonest_gap() -> None:
    asked = await _rounds(failing=False, asks=(0.0, 0.01, 0.02, 0.3))
    assert len(asked) == 3  # the first round, one for the three asks just after it, one for the ask at 0.3 s
    # the first round began at 0 or later, so the asked one may begin no sooner than SOONEST_SECONDS: timed
    # where the engine sees it (asked[1]), not against asked[0], which adds the first round's own requests
    # before its page (a loaded CI machine once put that at 20 ms and the measured gap at 34 ms)
    assert asked[1] >= SOONEST_SECONDS * 0.99
    assert asked[2] >= 0.3


async def test_a_failing_engine_keeps_its_backoff() -> None:
    asked = await _rounds(failing=True, asks=(0.1, 0.2, 0.3))
    assert len(asked) == 1


async def test_a_calm_sidecar_scrapes_at_the_calm_interval() -> None:
    asked = await _rounds(
        settings=ScrapeSettings(interval=0.05, calm_interval=0.3), calm_until=10.0, over=0.75
    )
    assert len(asked) == 3  # at 0, 0.3 and 0.6 s, where 0.05 s would have asked 15 times
    assert asked[1] >= 0.29


async def test_a_calm_wait_ends_at_the_interval_once_calm_ends() -> None:
    asked = await _rounds(settings=ScrapeSettings(interval=0.05, calm_interval=10.0), calm_until=0.2)
    assert len(asked) >= 4  # the first round, then every 0.05 s from ~0.2 s on
    assert 0.2 <= asked[1] < 0.32  # not 10 s later: the wait is looked at again every interval


async def test_the_calm_interval_is_never_shorter_than_the_interval() -> None:
    asked = await _rounds(settings=ScrapeSettings(interval=0.2, calm_interval=0.05), calm_until=10.0)
    assert 2 <= len(asked) <= 3  # at 0, 0.2 and 0.4 s (the last may slip past 0.5 s on a busy machine)
    assert all(later - earlier >= 0.19 for earlier, later in itertools.pairwise(asked))  # not 0.05
