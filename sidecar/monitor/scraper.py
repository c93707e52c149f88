"""The scraper loop: vLLM's ``/metrics`` (``/v1/models``, ``/version``: once per start) into the monitor.

Each round fetches the page with a timeout, scans it (see :mod:`sidecar.signals`), reads NVML in a worker
thread when enabled, and reports the outcome to the :class:`~sidecar.monitor.monitor.Monitor` with the
injected clock's time. After a failure the next round waits ``min(interval x 2^failures, max_backoff)``; a
success returns to ``interval``, or to ``calm_interval`` while the injected ``calm`` predicate holds
(nothing would learn from a page), cut short to ``interval`` as soon as it stops holding.

Admission may ask for a round sooner (:meth:`EngineScraper.scrape_soon`: when a waiting request would learn
something), never sooner than :data:`SOONEST_SECONDS` after the last one asked, and not while failing. Such
a round reads a *light* page from vLLM: only what admission decides on (:data:`sidecar.signals.vllm.LIGHT`),
merged into the last full page's snapshot. A full page costs vLLM's API process (the one that also
tokenizes and streams) ~5 ms on this project's CPU server, a light one ~0.6 ms (``bench/page_cost.py``).
Rounds at the interval stay full (the gateway page, the diagnoses and the pool come from them); where the
engine cannot filter its page (several API servers) or the light page falls short, every round is full.

Durations (by page), failures by reason and restarts go to a :class:`ScrapeRecorder` (Prometheus families:
``sidecar.server.metrics``); logging of state changes is the monitor's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Callable
from typing import Protocol

import httpx
from structlog.typing import FilteringBoundLogger

from sidecar.monitor.monitor import Monitor
from sidecar.monitor.nvml import NvmlReader
from sidecar.settings import ScrapeSettings
from sidecar.signals import MetricsParseError
from sidecar.signals.engines import BY_KIND, detect, parse_engine_metrics
from sidecar.signals.kinds import EngineKind
from sidecar.signals.vllm import EngineSnapshot, light_query, merge_light, parse_vllm_metrics

__all__ = ["EngineScraper", "Page", "ScrapeRecorder", "ScrapeSettings"]

MAX_PAGE_BYTES = 16 * 1024 * 1024
SOONEST_SECONDS = 0.05
"""Rounds asked for by admission are this far apart at least: a light page still costs vLLM's API process
~0.6 ms and the sidecar ~0.5 ms."""


class Page(enum.StrEnum):
    """Which page a round read (the ``page`` label of the scrape-duration histogram)."""

    FULL = "full"
    LIGHT = "light"  # only what admission reads (sidecar.signals.vllm.LIGHT)


class ScrapeRecorder(Protocol):
    """Where the scraper records how its rounds went (``sidecar.server.metrics.ScrapeMetrics``)."""

    def duration(self, seconds: float, page: Page) -> None:
        """A round's fetch and scan of ``page`` took ``seconds``."""

    def error(self, reason: str) -> None:
        """A round failed: connect, timeout, status, parse or too_large."""

    def restart(self) -> None:
        """The scrape loop died of a bug and was started again."""


class _ScrapeFailedError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class EngineScraper:
    """Scrapes one engine; :meth:`run` loops until cancelled."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        upstream: str,
        monitor: Monitor,
        metrics: ScrapeRecorder,
        *,
        settings: ScrapeSettings,
        clock: Callable[[], float] = time.monotonic,
        nvml: NvmlReader | None = None,
        on_round: Callable[[], None] | None = None,
        calm: Callable[[], bool] | None = None,
        log: FilteringBoundLogger | None = None,
    ) -> None:
        self._client = client
        self._base = upstream.rstrip("/")
        self._monitor = monitor
        self._metrics = metrics
        self._settings = settings
        self._clock = clock
        self._nvml = nvml
        self._models_fetched = False
        self._on_round = on_round
        self._calm = calm
        self._metrics_url = settings.metrics_url or f"{self._base}{settings.metrics_path()}"
        self._due: float | None = None  # when the next round should ask (set after each round)
        self._soon: float | None = None  # when admission wants a round, if sooner
        self._asked = -float("inf")  # when the last round asked
        self._woken = asyncio.Event()
        own_page = settings.engine in (None, EngineKind.VLLM) and settings.metrics_url is None
        self._light_url = f"{self._base}/metrics/?{light_query()}" if own_page else None
        self._light_works: bool | None = None  # unknown until a light round tried
        self._log = log
        self.last_page = b""
        """The last page that scanned cleanly, as the engine sent it (served again to gateways)."""

    async def _fetch_page(self, url: str | None = None) -> bytes:
        url = url or self._metrics_url
        try:
            response = await self._client.get(url, timeout=self._settings.timeout)
        except httpx.TimeoutException:
            message = f"no answer from {url} within {self._settings.timeout}s"
            raise _ScrapeFailedError("timeout", message) from None
        except httpx.HTTPError as exc:
            raise _ScrapeFailedError("connect", f"{url}: {type(exc).__name__}: {exc}") from None
        if response.status_code != httpx.codes.OK:
            raise _ScrapeFailedError("status", f"{url} answered HTTP {response.status_code}")
        if len(response.content) > MAX_PAGE_BYTES:
            raise _ScrapeFailedError("too_large", f"{url} is over {MAX_PAGE_BYTES} bytes")
        return response.content

    def _found_elsewhere(self, page: bytes) -> bool:
        """With no engine named, a JSON ``/metrics`` is trtllm-serve's: its Prometheus page is elsewhere."""
        if self._settings.engine is not None or self._settings.metrics_url is not None:
            return False
        if page.lstrip()[:1] not in (b"[", b"{") or self._metrics_url.endswith("/prometheus/metrics"):
            return False
        self._metrics_url = f"{self._base}{BY_KIND[EngineKind.TRTLLM_SERVE].metrics_path}"
        return True

    async def _fetch_max_model_len(self) -> None:
        """Read ``max_model_len`` and the served model name from ``/v1/models`` (best effort)."""
        try:
            response = await self._client.get(f"{self._base}/v1/models", timeout=self._settings.timeout)
            data = response.json()["data"][0]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
            return
        engine = self._monitor.engine
        if isinstance(data.get("max_model_len"), int):
            engine.max_model_len = data["max_model_len"]
        if isinstance(data.get("id"), str):
            engine.served_model = data["id"]
        self._models_fetched = True
        try:  # the release, for the prediction's defaults and profiling rules (GET /version, all releases)
            version = (await self._client.get(f"{self._base}/version", timeout=self._settings.timeout)).json()
        except (httpx.HTTPError, ValueError):
            return
        if isinstance(version, dict) and isinstance(version.get("version"), str):
            engine.version = version["version"]

    async def scrape_once(self, *, light: bool = False) -> bool:
        """One round (a light one when asked and possible); returns whether the engine answered usably."""
        if self._nvml is not None:
            gpus = await self._nvml.read_async()
            self._monitor.record_gpus(gpus, self._nvml.available, self._nvml.unavailable_reason)
        started = time.perf_counter()
        asked = self._asked = self._clock()
        if self._soon is not None and self._soon <= asked:
            self._soon = None
        if self._due is not None:  # asked late because the sidecar was busy: its own delay, not the engine's
            self._monitor.engine.own_delay += max(0.0, asked - self._due)
        page_kind = Page.FULL
        try:
            snapshot = await self._light_snapshot() if light else None
            if snapshot is None:
                page = await self._fetch_page()
                if self._found_elsewhere(page):
                    page = await self._fetch_page()
                text = page.decode("utf-8", errors="replace")
                snapshot = parse_engine_metrics(text, self._settings.engine or detect(text))
                self.last_page = page
            else:
                page_kind = Page.LIGHT
        except _ScrapeFailedError as failure:
            self._metrics.error(failure.reason)
            self._models_fetched = False
            self._light_works = None  # an engine that comes back may serve its pages differently
            self._monitor.record_failure(str(failure), self._clock())
            return False
        except MetricsParseError as exc:
            self._metrics.error("parse")
            self._monitor.record_failure(f"unparseable /metrics page: {exc}", self._clock())
            return False
        finally:
            self._metrics.duration(time.perf_counter() - started, page_kind)
        if not self._models_fetched:
            await self._fetch_max_model_len()
        self._monitor.record_success(snapshot, self._clock(), sampled_at=asked)
        return True

    async def _light_snapshot(self) -> EngineSnapshot | None:
        """The last full snapshot with a light page's values, or ``None``: read a full page instead.

        ``None`` without asking while no light page can serve (not vLLM, no full page yet, the engine
        down, or light pages found wanting); a light page that is refused (HTTP status), unparseable, or
        short of what the full page showed (:func:`~sidecar.signals.vllm.merge_light`) turns light rounds
        off (logged once) until the engine next goes down. Connection failures and timeouts propagate.
        """
        engine = self._monitor.engine
        full = engine.snapshot
        if self._light_url is None or self._light_works is False or not engine.up:
            return None
        if full is None or full.kind is not EngineKind.VLLM:
            return None
        merged = None
        try:
            page = await self._fetch_page(self._light_url)
            merged = merge_light(full, parse_vllm_metrics(page.decode("utf-8", errors="replace")))
            why = "the light page lacks what the full page shows"
        except _ScrapeFailedError as failure:
            if failure.reason != "status":
                raise
            why = str(failure)
        except MetricsParseError as exc:
            why = f"unparseable light page: {exc}"
        if merged is None and self._log is not None:
            self._log.warning("light_scrapes_off", url=self._light_url, why=why)
        self._light_works = merged is not None
        return merged

    def calm(self) -> bool:
        """Whether the ``calm`` predicate holds (never without one)."""
        return self._calm is not None and self._calm()

    def next_delay(self) -> float:
        """Seconds until the next round: the interval (the calm one while calm), or the failures' backoff."""
        failures = self._monitor.engine.consecutive_failures
        if failures == 0:
            interval = self._settings.interval
            return max(self._settings.calm_interval, interval) if self.calm() else interval
        backoff: float = self._settings.interval * 2.0**failures
        return min(backoff, max(self._settings.max_backoff, self._settings.interval))

    def schedule_next(self) -> float:
        """The delay before the next round (:meth:`next_delay`), noting when that round is due.

        A round that asks later than it was due was held up by the sidecar's own event loop; that lateness
        is not counted in the engine's metrics age (:meth:`EngineState.metrics_age`).
        """
        delay = self._monitor.engine.scrape_delay = self.next_delay()
        self._due = self._clock() + delay
        return delay

    def scrape_soon(self, delay: float) -> None:
        """Ask for a round ``delay`` seconds from now, if that is before the next one is due.

        The earliest ask is kept, and a round answers every ask due by the time it asks; admission asks
        again after each round (its dispatch runs on every scrape), so a later ask is never lost for long.
        """
        at = self._clock() + max(0.0, delay)
        if self._soon is None or at < self._soon:
            self._soon = at
            self._woken.set()

    async def _sleep(self, delay: float) -> bool:
        """Until ``delay`` seconds have passed or a round asked for by :meth:`scrape_soon` is due.

        A calm wait (longer than the interval, engine healthy) is looked at again every interval and ends
        at the interval once the sidecar is no longer calm, so a burst is not read a second late. Returns
        whether the round it ends for was asked for (due before the interval's round).
        """
        begun = self._clock()
        interval = self._settings.interval
        while True:
            target = begun + delay
            healthy = self._monitor.engine.consecutive_failures == 0
            if delay > interval and healthy and not self.calm():
                target = begun + interval
            asked = False
            if self._soon is not None and healthy:
                soon = max(self._soon, self._asked + SOONEST_SECONDS)
                asked = soon < target
                target = min(target, soon)
            remaining = target - self._clock()
            if remaining <= 0:
                return asked
            self._woken.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, interval)):
                    await self._woken.wait()

    async def run(self) -> None:
        """Scrape forever (until cancelled): full rounds at the interval, light ones when asked sooner."""
        light = False
        while True:
            await self.scrape_once(light=light)
            if self._on_round is not None:
                self._on_round()
            light = await self._sleep(self.schedule_next())

    async def supervise(self, log: FilteringBoundLogger) -> None:
        """:meth:`run`, started again (after the interval, counted, logged) whenever it dies of a bug.

        A scrape loop that died silently would leave admission deciding on ever older metrics; the
        staleness check would notice, but the sidecar would never recover without a restart.
        """
        while True:
            try:
                await self.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any bug in a round: keep watching the engine
                self._metrics.restart()
                log.error("scraper_restarted", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(self._settings.interval)
