"""``kv-sidecar check``: one scrape, one comparison with the prediction, a report, an exit status.

Exit status 0 when no diagnosis is a warning or worse, 1 when one is (usable in CI and as a
readiness gate), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from sidecar.flags import engine_kind
from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings, Severity
from sidecar.monitor.documents import budget_document
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.nvml import NvmlReader
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.scraper import EngineScraper, ScrapeSettings
from sidecar.server.metrics import ScrapeMetrics

EXIT_OK = 0
EXIT_PROBLEM = 1


def _cell(value: Any, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def render_check(monitor: Monitor, upstream: str) -> str:
    """The human-readable ``check`` report."""
    engine, comparison = monitor.engine, monitor.comparison
    snapshot = engine.snapshot
    if engine.up and snapshot is not None:
        state = (
            f"up, model {engine.served_model or snapshot.model_name or '?'}, "
            f"KV usage {_cell(snapshot.kv_usage, '{:.1%}')}, running {_cell(snapshot.running, '{:g}')}, "
            f"waiting {_cell(snapshot.waiting, '{:g}')}, "
            f"preemptions {_cell(snapshot.preemptions_total, '{:g}')}"
        )
    else:
        state = f"DOWN: {engine.last_error}"
    drift = comparison.pool_drift_ratio
    lines = [
        f"engine {upstream}: {state}",
        "",
        f"  {'':<22}{'predicted':>14}{'engine':>14}",
        f"  {'KV pool tokens':<22}{_cell(comparison.predicted_pool_tokens, '{:,}'):>14}"
        f"{_cell(comparison.engine_pool_tokens, '{:,}'):>14}"
        + (f"   drift {drift:+.1%}" if drift is not None else ""),
        f"  {'max concurrency':<22}{_cell(comparison.predicted_max_concurrency, '{:.2f}x'):>14}"
        f"{_cell(comparison.engine_max_concurrency, '{:.2f}x'):>14}   target {comparison.target_concurrency}"
        f" at {_cell(comparison.max_model_len, '{:,}')} tokens",
        f"  {'KV cache dtype':<22}{_cell(comparison.requested_kv_dtype):>14}"
        f"{_cell(comparison.engine_kv_dtype):>14}",
        "",
    ]
    if monitor.plan_error:
        lines.append(f"  prediction unavailable: {monitor.plan_error}")
    if not monitor.diagnoses:
        lines.append("  no problems found")
    for diagnosis in monitor.diagnoses:
        lines.append(f"  {diagnosis.severity.value.upper():<9}{diagnosis.id}: {diagnosis.message}")
        lines.append(f"  {'':<9}advice: {diagnosis.advice}")
    return "\n".join(lines)


async def run_check(args: argparse.Namespace, inputs: PlanInputs, settings: MonitorSettings) -> int:
    """Scrape once, print the report, return the exit status."""
    log = make_logger(level="error")
    monitor = Monitor(inputs, settings, log)
    nvml = NvmlReader(log) if args.nvml != "off" else None
    monitor.gpu.enabled = nvml is not None
    async with httpx.AsyncClient() as client:
        scraper = EngineScraper(
            client,
            args.upstream,
            monitor,
            ScrapeMetrics(CollectorRegistry()),
            settings=ScrapeSettings(
                timeout=args.scrape_timeout, engine=engine_kind(args.engine), metrics_url=args.engine_metrics
            ),
            clock=time.monotonic,
            nvml=nvml,
        )
        await scraper.scrape_once()
    if nvml is not None:
        nvml.close()
    if args.format == "json":
        print(
            json.dumps(
                {"upstream": args.upstream, "engine_up": bool(monitor.engine.up), **budget_document(monitor)}
            )
        )
    else:
        print(render_check(monitor, args.upstream))
    worst = max((d.severity.rank for d in monitor.diagnoses), default=-1)
    return EXIT_PROBLEM if worst >= Severity.WARNING.rank else EXIT_OK
