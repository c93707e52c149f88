"""Wiring and lifecycle: one application object owns every piece and passes it explicitly.

``SidecarApp`` creates the Prometheus registry, the monitor, the scraper, the admission controller,
the proxy and the admin server; nothing is global. :meth:`SidecarApp.start` binds the sockets and
starts the scrape loop; :meth:`SidecarApp.drain` stops taking work and waits for in-flight
responses; :meth:`SidecarApp.stop` closes everything; :meth:`SidecarApp.serve` runs until SIGTERM or
SIGINT, then drains and stops.

Drain: readiness turns false at once; new requests get 503 ``draining`` with ``Retry-After``; queued
ones are let go with 503 ``draining``; admitted ones (streams included) may finish within
``drain_timeout``; then the sockets close and ``kv-sidecar run`` exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry
from structlog.typing import FilteringBoundLogger

from sidecar.admission.controller import AdmissionController, QueueSettings
from sidecar.admission.conversation import EngineChat
from sidecar.admission.decide import AdmissionConfig, AdmissionMode
from sidecar.admission.geometry import PoolView
from sidecar.admission.outputs import OutputSettings
from sidecar.admission.pressure import PressureDetector, PressureSettings, PressureState, Staleness
from sidecar.admission.retry import clamp_retry_after
from sidecar.admission.tokens import TokenCounter
from sidecar.budget.catalog import ResolvedModel
from sidecar.late import LateResolver
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.nvml import NvmlReader
from sidecar.monitor.planning import MODEL_RETRY_SECONDS, PlanInputs
from sidecar.monitor.pool import admission_pool
from sidecar.monitor.scraper import EngineScraper, ScrapeSettings
from sidecar.server.admin import build_admin_app, fallback_reason
from sidecar.server.connection import HeadDeadline, ScrapePage, head_middleware, serve_guarded
from sidecar.server.counting import CountingFiles, PromptCounting, count_disagrees
from sidecar.server.gateway import CONTENT_TYPE as GATEWAY_CONTENT_TYPE
from sidecar.server.gateway import GatewayPage, current_load
from sidecar.server.lifecycle import Lifecycle
from sidecar.server.metrics import (
    AdmissionCollector,
    AdmissionMetrics,
    ConnectionMetrics,
    GatewayCollector,
    MonitorCollector,
    ProxyMetrics,
    ScrapeMetrics,
)
from sidecar.server.proxy import Proxy, ProxySettings
from sidecar.server.recount_probe import PromptRecounter
from sidecar.settings import ADMIN_LISTEN, DRAIN_TIMEOUT_SECONDS, LISTEN, ClientLimits
from sidecar.signals import EngineSnapshot

DRAIN_POLL_SECONDS = 0.05
KEEPALIVE_SECONDS = 75.0  # idle keep-alive connections are closed after this (aiohttp's default is an hour)
MAX_LINE_BYTES = 8190  # request line and each header line
MAX_HEADERS = 100


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How ``kv-sidecar run`` was asked to run."""

    upstream: str
    admin_listen: tuple[str, int] = ADMIN_LISTEN
    listen: tuple[str, int] = LISTEN
    proxy: bool = True
    scrape: ScrapeSettings = field(default_factory=ScrapeSettings)
    nvml: bool = True
    staleness: Staleness = field(default_factory=Staleness)
    outputs: OutputSettings = field(default_factory=OutputSettings)
    drain_timeout: float = DRAIN_TIMEOUT_SECONDS
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    pressure: PressureSettings = field(default_factory=PressureSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    limits: ClientLimits = field(default_factory=ClientLimits)
    tokenizer_model: str | None = None  # the folder prompts are counted with: --model's
    tokenizer: CountingFiles | None = None  # vLLM's separate --tokenizer: counted with it instead
    chat: EngineChat = field(default_factory=EngineChat)  # how vLLM was told to render chats
    admin_token: str | None = None
    model_retry: float = MODEL_RETRY_SECONDS


class SidecarApp:
    """The running sidecar: registry, monitor, scraper, admission, proxy and admin server."""

    def __init__(
        self,
        options: RunOptions,
        inputs: PlanInputs,
        settings: MonitorSettings,
        log: FilteringBoundLogger,
        *,
        clock: Callable[[], float] = time.monotonic,
        nvml_module: Any | None = None,
        counter: TokenCounter | None = None,
        resolve_model: Callable[[], ResolvedModel] | None = None,
        model_error: str | None = None,
        resolve_tokenizer: Callable[[], Path] | None = None,
    ) -> None:
        self.options = options
        self.log = log
        self.clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        self.monitor = Monitor(inputs, settings, log)
        self.monitor.gpu.enabled = options.nvml
        self.monitor.model_error = model_error
        self._pool_cache: tuple[object, object, PoolView | None] | None = None
        files = options.tokenizer or CountingFiles(options.tokenizer_model)
        self.late = LateResolver(
            self.monitor, log, interval=options.model_retry, clock=clock,
            on_model=lambda resolved: self._recount(model=resolved.directory),
            resolve_model=resolve_model if model_error is not None else None,
            resolve_tokenizer=resolve_tokenizer,
            on_tokenizer=lambda folder: self._recount(tokenizer=folder), tokenizer_problem=files.problem,
        )  # fmt: skip
        self.lifecycle = Lifecycle(staleness=options.staleness)
        self.registry.register(MonitorCollector(self.monitor, clock))
        self.scrape_metrics = ScrapeMetrics(self.registry)
        self.nvml = NvmlReader(log, nvml_module) if options.nvml else None
        self.controller = AdmissionController(
            options.admission,
            PressureDetector(options.pressure),
            options.queue,
            AdmissionMetrics(self.registry),
            clock=clock,
            max_model_len=self.monitor.request_max_model_len,
            pool=self._pool,
            kv_samples=self._kv_samples,
            metrics_age=self._metrics_age,
            staleness=options.staleness,
            outputs=options.outputs,
            on_policy=self._on_policy,
            max_num_seqs=lambda: inputs.max_num_seqs,
            scrape_soon=self._scrape_soon,
            on_count_mismatch=partial(count_disagrees, log),
        )
        self.registry.register(AdmissionCollector(self.controller))
        self.counting = PromptCounting(files, options.chat, self.controller.audit, log)
        gateway = GatewayCollector(lambda: current_load(self.controller, self._engine_snapshot))
        self.registry.register(gateway)
        self.proxy: Proxy | None = None
        self._gateway_page = GatewayPage(gateway, self._engine_page)
        if options.proxy:
            self.proxy = Proxy(
                ProxySettings(upstream=options.upstream, limits=options.limits, chat=options.chat),
                self.controller,
                counter or self.counting.load(),
                ProxyMetrics(self.registry),
                self.lifecycle,
                log,
                engine_retry_after=self._engine_retry_after,
                gateway_page=self._gateway_page,
                recounter=PromptRecounter(options.chat, self.controller.audit, self.monitor),
            )
        self._client: httpx.AsyncClient | None = None
        self._scraper: EngineScraper | None = None
        self._scrape_task: asyncio.Task[None] | None = None
        self._runners: list[web.AppRunner] = []
        self._listeners: list[asyncio.Server] = []
        self._guards: dict[object, HeadDeadline] = {}
        self.connection_metrics = ConnectionMetrics(self.registry)
        self.admin_port: int | None = None
        self.proxy_port: int | None = None

    def _pool(self) -> PoolView | None:
        """The KV pool admission plans against: the engine's blocks, else the prediction's.

        Asked several times per admission decision: computed once per scrape (per snapshot and ledger).
        """
        snapshot, ledger = self.monitor.engine.snapshot, self.monitor.ledger
        if self._pool_cache is not None and self._pool_cache[0] is snapshot and self._pool_cache[1] is ledger:
            return self._pool_cache[2]
        view = admission_pool(self.monitor).view
        self._pool_cache = (snapshot, ledger, view)
        return view

    def _engine_snapshot(self) -> EngineSnapshot | None:
        engine = self.monitor.engine
        return engine.snapshot if engine.up else None

    def _engine_page(self) -> bytes:
        """The engine's last page while it is up (a gateway must not route on a dead engine's figures)."""
        return self._scraper.last_page if self._scraper is not None and self.monitor.engine.up else b""

    def _metrics_age(self, now: float) -> float | None:
        engine = self.monitor.engine
        return engine.metrics_age(now) if engine.up else None

    def _on_policy(self, policy: AdmissionMode, why: str) -> None:
        requested = self.options.admission.mode
        if policy is requested:
            self.log.info("admission_policy", policy=policy.value, requested=requested.value)
        else:
            why = fallback_reason(self.monitor)  # the reason /status gives, from the same place
            self.log.warning("admission_policy", policy=policy.value, requested=requested.value, why=why)

    def _kv_samples(self) -> list[tuple[float, float]]:
        return [(o.at, o.kv_usage) for o in self.monitor.history.observations() if o.kv_usage is not None]

    def _scrape_soon(self, delay: float) -> None:
        if self._scraper is not None:
            self._scraper.scrape_soon(delay)

    def _calm(self) -> bool:
        """Capacity admission (its ledger plans each peak), usage below the release threshold, no pressure."""
        snapshot, now = self._engine_snapshot(), self.clock()
        threshold = self.options.pressure.release_threshold
        usage = None if snapshot is None else snapshot.kv_usage
        if usage is None or usage >= threshold or self.controller.policy() is not AdmissionMode.CAPACITY:
            return False  # without the ledger (lanes, token-budget), nothing says usage will not climb
        if self.controller.pressure_state(now) is not PressureState.NORMAL:
            return False
        waiting = {lane: len(queue) for lane, queue in self.controller.queues.items()}
        return self.controller.planner.scrape_can_wait(waiting)

    def _engine_retry_after(self) -> int:
        delay = self._scraper.next_delay() if self._scraper else self.options.scrape.interval
        return clamp_retry_after(delay)

    def _after_scrape(self) -> None:
        """Feed the pressure detector after every scrape round."""
        engine = self.monitor.engine
        now = self.clock()
        stale = self.options.staleness.is_stale(engine.up, engine.metrics_age(now))
        snapshot = engine.snapshot if engine.up else None
        if snapshot is not None:
            self.controller.planner.engine_record(snapshot.generation_lengths)
        self.controller.observe(
            now,
            snapshot.kv_usage if snapshot else None,
            stale=stale,
            steps=snapshot.iterations_total if snapshot else None,
            waiting=snapshot.waiting if snapshot else None,
            running=snapshot.running if snapshot else None,
            sampled_at=engine.sampled_at,
        )

    async def _serve(
        self,
        app: web.Application,
        address: tuple[str, int],
        *,
        cancel_on_disconnect: bool,
        port_name: str,
        scrape_page: ScrapePage | None = None,
    ) -> int:
        app.middlewares.insert(0, head_middleware(self._guards))
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            handler_cancellation=cancel_on_disconnect,
            shutdown_timeout=1.0,
            keepalive_timeout=KEEPALIVE_SECONDS,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
        )
        await runner.setup()
        self._runners.append(runner)
        timeouts = self.connection_metrics.header_timeouts.labels(port=port_name)
        listener = await serve_guarded(
            runner,
            address[0],
            address[1],
            head_timeout=self.options.limits.header_timeout,
            guards=self._guards,
            on_timeout=timeouts.inc,
            scrape_page=scrape_page,
        )
        self._listeners.append(listener)
        return int(listener.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Bind the admin (and proxy) ports, then start scraping."""
        keepalive = self.options.limits.upstream_keepalive  # below the engine's own, as for the proxy
        self._client = httpx.AsyncClient(limits=httpx.Limits(max_connections=4, keepalive_expiry=keepalive))
        self._scraper = EngineScraper(
            self._client, self.options.upstream, self.monitor, self.scrape_metrics,
            settings=self.options.scrape,
            clock=self.clock,
            nvml=self.nvml,
            on_round=self._after_scrape,
            calm=self._calm,
            log=self.log,
        )  # fmt: skip
        admin = build_admin_app(
            self.monitor,
            self.registry,
            self.lifecycle,
            self.clock,
            self.controller,
            token=self.options.admin_token,
        )
        self.admin_port = await self._serve(
            admin, self.options.admin_listen, cancel_on_disconnect=False, port_name="admin"
        )
        if self.proxy is not None:
            await self.proxy.start()
            self.proxy_port = await self._serve(
                self.proxy.app(),
                self.options.listen,
                cancel_on_disconnect=True,
                port_name="proxy",
                scrape_page=ScrapePage(self._gateway_page.render, GATEWAY_CONTENT_TYPE),
            )
        self._scrape_task = asyncio.create_task(self._scraper.supervise(self.log), name="kv-sidecar-scraper")
        self.late.start()  # --model or a drafter vLLM is still downloading
        self.log.info(
            "started",
            upstream=self.options.upstream,
            admin=f"{self.options.admin_listen[0]}:{self.admin_port}",
            proxy=f"{self.options.listen[0]}:{self.proxy_port}" if self.proxy else None,
        )

    async def _recount(self, *, model: Path | None = None, tokenizer: Path | None = None) -> None:
        """``--model`` or vLLM's ``--tokenizer`` resolved late: count with what it names from now on."""
        if self.proxy is not None and (model or tokenizer) is not None:
            self.proxy.counter = await self.counting.reload(model=model, tokenizer=tokenizer)

    async def drain(self) -> bool:
        """Stop taking work and wait for in-flight responses; ``True`` when all ended in time."""
        self.lifecycle.draining = True
        self.controller.start_drain()
        deadline = self.clock() + self.options.drain_timeout
        self.log.info("draining", inflight=self.controller.total_inflight, timeout=self.options.drain_timeout)
        while self.clock() < deadline:
            open_requests = self.proxy.open_requests if self.proxy else 0
            if self.controller.total_inflight == 0 and open_requests == 0:
                return True
            await asyncio.sleep(DRAIN_POLL_SECONDS)
        self.log.warning("drain_timeout", inflight=self.controller.total_inflight)
        return False

    async def stop(self) -> None:
        """Stop scraping and close every socket."""
        await self.late.stop()
        if self._scrape_task is not None:
            self._scrape_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scrape_task
        for listener in self._listeners:
            listener.close()  # no new connections; the runners close the open ones
        for runner in reversed(self._runners):
            await runner.cleanup()
        for listener in self._listeners:
            await listener.wait_closed()
        self._runners.clear()
        self._listeners.clear()
        if self.proxy is not None:
            await self.proxy.close()
        if self._client is not None:
            await self._client.aclose()
        if self.nvml is not None:
            await asyncio.to_thread(self.nvml.close)
        self.log.info("stopped")

    async def serve(self) -> None:
        """Run until SIGTERM or SIGINT, then drain and stop."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await self.start()
        settle_heap()
        try:
            await stop.wait()
            await self.drain()
        finally:
            await self.stop()


def settle_heap() -> None:
    """Move everything built at start-up out of the garbage collector's reach (``gc.freeze``).

    The start-up heap (imports, the parsed model config, the registry: about 50,000 tracked objects) is
    alive for the process's life, yet every full collection walked it: 30 ms pauses under load on the
    2-core dev VM, stalling the proxy and the gateway's ``/metrics`` alike (README, "Benchmarks"). Frozen
    objects are never collected, so this is only for objects that live as long as the process.
    """
    gc.collect()
    gc.freeze()
