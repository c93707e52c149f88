"""Rounds asked for by admission read vLLM's light page (only what admission reads), merged into the last
full page; where the engine cannot filter its page, every round stays full."""

from __future__ import annotations

import asyncio
import io
from urllib.parse import parse_qs

import httpx
import pytest

from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.scraper import EngineScraper, Page
from sidecar.settings import ScrapeSettings
from sidecar.signals import parse_vllm_metrics
from sidecar.signals.kinds import EngineKind
from sidecar.signals.vllm import ITERATIONS, KV_USAGE, LIGHT, RUNNING, light_query, merge_light
from tests.fake_vllm import PRESSURE_PAGE, page, substitute

FULL = page(PRESSURE_PAGE)


def light_page(**values: float) -> str:
    """What vLLM answers ``/metrics/?name[]=...`` with: only the LIGHT samples (``values`` by family)."""
    text = FULL
    for metric, value in values.items():
        text = substitute(text, metric, value)
    kept = [
        line
        for line in text.splitlines()
        if not line.startswith("#") and line.split("{", 1)[0].split(" ", 1)[0] in LIGHT
    ]
    return "\n".join(kept) + "\n"


def test_the_light_query_names_every_light_family() -> None:
    assert parse_qs(light_query())["name[]"] == list(LIGHT)


def test_a_light_page_replaces_only_what_admission_reads() -> None:
    full = parse_vllm_metrics(FULL)
    light = parse_vllm_metrics(light_page(**{KV_USAGE: 0.125, RUNNING: 3, ITERATIONS: 999_999}))
    merged = merge_light(full, light)
    assert merged is not None
    assert (merged.kv_usage, merged.running, merged.iterations_total) == (0.125, 3, 999_999)
    assert merged.cache_config == full.cache_config
    assert merged.cache_config is not None
    assert merged.generation_lengths == full.generation_lengths
    assert merged.generation_lengths
    assert merged.prompt_tokens_total == full.prompt_tokens_total


@pytest.mark.parametrize(
    ("light_text", "why"),
    [
        ("", "an empty page: a registry that cannot filter (several API servers)"),
        (light_page().replace('engine="0"', 'engine="1"'), "another engine than the full page's"),
        ("\n".join(line for line in light_page().splitlines() if ITERATIONS not in line), "no step count"),
    ],
)
def test_a_light_page_that_falls_short_is_not_merged(light_text: str, why: str) -> None:
    assert merge_light(parse_vllm_metrics(FULL), parse_vllm_metrics(light_text)) is None, why


class Pages:
    """Which pages a scraper's rounds read, by kind."""

    def __init__(self) -> None:
        self.read: list[Page] = []

    def duration(self, seconds: float, page: Page) -> None:
        self.read.append(page)

    def error(self, reason: str) -> None:
        self.read.append(reason)  # type: ignore[arg-type]

    def restart(self) -> None:
        pass


async def _scraper_rounds(
    light_answer: httpx.Response, *, asks: int = 2, settings: ScrapeSettings | None = None
) -> tuple[list[str], Pages, EngineScraper, Monitor, str]:
    """A scraper's first round and ``asks`` rounds asked for 60 ms apart (10 s interval): the paths read."""
    log = io.StringIO()
    monitor = Monitor(PlanInputs(), MonitorSettings(), make_logger(io.StringIO()))
    paths: list[str] = []

    async def engine(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics/":
            paths.append(f"light {request.url.query.decode()}")
            return light_answer
        if request.url.path == "/metrics":
            paths.append("full")
            return httpx.Response(200, text=FULL)
        return httpx.Response(200, text="{}")

    pages = Pages()
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        scraper = EngineScraper(
            client, "http://engine", monitor, pages,
            settings=settings or ScrapeSettings(interval=10.0), log=make_logger(log),
        )  # fmt: skip
        task = asyncio.create_task(scraper.run())
        for _ in range(asks):
            await asyncio.sleep(0.06)
            scraper.scrape_soon(0.0)
        await asyncio.sleep(0.08)
        task.cancel()
    return paths, pages, scraper, monitor, log.getvalue()


async def test_asked_rounds_read_the_light_page_and_interval_rounds_the_full_one() -> None:
    answer = httpx.Response(200, text=light_page(**{KV_USAGE: 0.125, ITERATIONS: 999_999}))
    paths, pages, scraper, monitor, _ = await _scraper_rounds(answer)
    assert paths == ["full", f"light {light_query()}", f"light {light_query()}"]
    assert pages.read == [Page.FULL, Page.LIGHT, Page.LIGHT]
    snapshot = monitor.engine.snapshot
    assert snapshot is not None
    assert snapshot.kv_usage == 0.125
    assert snapshot.iterations_total == 999_999
    assert snapshot.cache_config is not None  # from the full page
    assert scraper.last_page == FULL.encode()  # the gateway keeps being served the engine's whole page


@pytest.mark.parametrize(
    "answer",
    [httpx.Response(200, text=""), httpx.Response(404, text="not found"), httpx.Response(200, text="x{")],
    ids=["empty (several API servers)", "refused", "unparseable"],
)
async def test_an_engine_that_cannot_serve_a_light_page_is_read_in_full(answer: httpx.Response) -> None:
    paths, pages, _, monitor, log = await _scraper_rounds(answer)
    assert paths == ["full", f"light {light_query()}", "full", "full"]  # tried once, then full rounds
    assert pages.read == [Page.FULL, Page.FULL, Page.FULL]  # not counted as failures
    assert monitor.engine.up
    assert log.count("light_scrapes_off") == 1


async def test_other_engines_and_custom_metrics_urls_are_always_read_in_full() -> None:
    for settings in (
        ScrapeSettings(interval=10.0, engine=EngineKind.SGLANG),
        ScrapeSettings(interval=10.0, metrics_url="http://engine/metrics"),
    ):
        paths, *_ = await _scraper_rounds(httpx.Response(200, text=light_page()), settings=settings)
        assert paths == ["full", "full", "full"], settings
