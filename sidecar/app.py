"""Wiring and lifecycle: one application object owns every piece and passes it explicitly.

``SidecarApp`` creates the Prometheus registry, the monitor, the scraper and the admin server;
nothing is global. :meth:`SidecarApp.start` binds the sockets and starts the scrape loop,
:meth:`SidecarApp.stop` undoes it; :meth:`SidecarApp.serve` runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry
from structlog.typing import FilteringBoundLogger

from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.nvml import NvmlReader
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.scraper import EngineScraper, ScrapeMetrics, ScrapeSettings
from sidecar.server.admin import Lifecycle, build_admin_app
from sidecar.server.metrics import register_monitor_metrics


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How ``kv-sidecar run`` was asked to run."""

    upstream: str
    admin_listen: tuple[str, int] = ("0.0.0.0", 9090)  # noqa: S104 - a sidecar's admin port serves the pod
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    nvml: bool = True
    stale_policy: str = "open"


def _bound_port(site: web.TCPSite, requested: int) -> int:
    """The port a site actually bound (differs from ``requested`` when that was 0)."""
    server = site._server  # noqa: SLF001 - aiohttp has no public getter for the bound socket
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else requested


class SidecarApp:
    """The running sidecar: registry, monitor, scraper and admin server."""

    def __init__(
        self,
        options: RunOptions,
        inputs: PlanInputs,
        settings: MonitorSettings,
        log: FilteringBoundLogger,
        *,
        clock: Callable[[], float] = time.monotonic,
        nvml_module: Any | None = None,
    ) -> None:
        self.options = options
        self.log = log
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        self.monitor = Monitor(inputs, settings, log)
        self.monitor.gpu.enabled = options.nvml
        self.lifecycle = Lifecycle(stale_policy=options.stale_policy)
        register_monitor_metrics(self.registry, self.monitor, clock)
        self.scrape_metrics = ScrapeMetrics(self.registry)
        self.nvml = NvmlReader(log, nvml_module) if options.nvml else None
        self._client: httpx.AsyncClient | None = None
        self._scrape_task: asyncio.Task[None] | None = None
        self._admin_runner: web.AppRunner | None = None
        self.admin_port: int | None = None

    async def start(self) -> None:
        """Bind the admin port, then start scraping."""
        self._client = httpx.AsyncClient(limits=httpx.Limits(max_connections=4))
        scraper = EngineScraper(
            self._client,
            self.options.upstream,
            self.monitor,
            self.scrape_metrics,
            settings=self.options.scrape,
            clock=self.clock,
            nvml=self.nvml,
        )
        admin = build_admin_app(self.monitor, self.registry, self.lifecycle, self.clock)
        self._admin_runner = web.AppRunner(admin, access_log=None, handle_signals=False)
        await self._admin_runner.setup()
        host, port = self.options.admin_listen
        site = web.TCPSite(self._admin_runner, host, port, reuse_address=True)
        await site.start()
        self.admin_port = _bound_port(site, port)
        self._scrape_task = asyncio.create_task(scraper.run(), name="kv-sidecar-scraper")
        self.log.info("started", upstream=self.options.upstream, admin=f"{host}:{self.admin_port}")

    async def stop(self) -> None:
        """Stop scraping and close every socket."""
        if self._scrape_task is not None:
            self._scrape_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scrape_task
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
        if self._client is not None:
            await self._client.aclose()
        if self.nvml is not None:
            await asyncio.to_thread(self.nvml.close)
        self.log.info("stopped")

    async def serve(self) -> None:
        """Run until SIGTERM or SIGINT."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await self.start()
        try:
            await stop.wait()
        finally:
            self.lifecycle.draining = True
            await self.stop()
