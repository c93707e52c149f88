"""One run of a shape against one target: the clients, what vLLM and the sidecar showed, the run's metrics.

Per run: sent, completed, refused (non-200 with ``X-KV-Sidecar-Reason``), their Retry-After values, lost
(everything else: no answer, a bare error, a cut stream), vLLM preemptions, peak ``vllm:kv_cache_usage_perc``,
short p95, long/mid p50, makespan, answer lengths, the sidecar's peak queue depth and, with retries, the
retried share admitted. Latencies are per attempt.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from tests.harness.admission_shapes import Planned, Shape
from tests.harness.spike import ENGINE_POLL_SECONDS, _engine_sample, engine_snapshot


@dataclass
class Attempt:
    """One HTTP exchange."""

    status: int | None
    latency: float
    reason: str | None = None
    retry_after: float | None = None
    tokens: int | None = None
    error: str | None = None
    ended_at: float = 0.0

    @property
    def ok(self) -> bool:
        """A 200 with its whole body (a stream that reached ``[DONE]``)."""
        return self.status == 200 and self.error is None


@dataclass
class Client:
    """One client's fate: its first attempt and, after a refusal with Retry-After, its one retry."""

    kind: str
    stream: bool
    first: Attempt
    retry: Attempt | None = None

    @property
    def final(self) -> Attempt:
        """The attempt that decided the outcome."""
        return self.retry or self.first


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used so far (Linux ``/proc``), or ``None`` where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_spent(pid: int, before: float | None) -> float | None:
    """CPU seconds ``pid`` used since :func:`process_cpu_seconds` read ``before``."""
    after = process_cpu_seconds(pid)
    return None if before is None or after is None else after - before


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``None`` when empty)."""
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))] if values else None


async def _attempt(
    session: aiohttp.ClientSession, target: str, body: dict[str, Any], limit: float
) -> Attempt:
    started = time.monotonic()
    try:
        async with asyncio.timeout(limit), session.post(target + "/v1/completions", json=body) as response:
            tokens, error = None, None
            if response.status == 200 and body.get("stream"):
                done = False
                async for raw in response.content:
                    line = raw.decode().strip()
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: ") and (usage := json.loads(line[6:]).get("usage")):
                        tokens = usage.get("completion_tokens")
                error = None if done else "stream ended without [DONE]"
            elif response.status == 200:
                tokens = (await response.json()).get("usage", {}).get("completion_tokens")
            else:
                await response.read()
            retry = response.headers.get("Retry-After")
            return Attempt(
                response.status, time.monotonic() - started, response.headers.get("X-KV-Sidecar-Reason"),
                float(retry) if retry and retry.replace(".", "", 1).isdigit() else None, tokens, error,
                time.monotonic(),
            )  # fmt: skip
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        now = time.monotonic()
        return Attempt(None, now - started, error=f"{type(exc).__name__}: {exc}", ended_at=now)


async def sidecar_scrapes(session: aiohttp.ClientSession, admin: str | None) -> float | None:
    """How many rounds the sidecar's scraper has run (its ``kv_sidecar_scrape_duration_seconds`` counts, summed
    over pages, full and light)."""
    if admin is None:
        return None
    async with session.get(admin + "/metrics") as response:
        page = await response.text()
    counts = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
              if line.startswith("kv_sidecar_scrape_duration_seconds_count")]  # fmt: skip
    return sum(counts) if counts else None


async def run_once(
    target: str, engine: str, shape: Shape, planned: list[Planned], token_seed: int, admin: str | None = None
) -> dict[str, Any]:
    """Send ``planned`` to ``target`` with fresh prompts, watching vLLM (and the sidecar's ``admin``)."""
    rng = random.Random(token_seed)
    prefix = [rng.randrange(10, 500) for _ in range(shape.shared_prefix)]
    bodies = []
    for p in planned:
        body: dict[str, Any] = {
            "model": "tiny", "prompt": prefix + [rng.randrange(10, 500) for _ in range(p.prompt_len)],
            "max_tokens": p.kind.max_tokens, "temperature": p.kind.temperature,
        }  # fmt: skip
        if p.kind.ignore_eos:
            body["ignore_eos"] = True
        if p.kind.temperature > 0:
            body["seed"] = token_seed * 1000 + p.seed
        if p.kind.stop_token_ids:
            body["stop_token_ids"] = list(p.kind.stop_token_ids)
        if p.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        bodies.append(body)
    peak_kv, max_queue = 0.0, 0
    stop = asyncio.Event()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        before, scrapes_before = await engine_snapshot(session, engine), await sidecar_scrapes(session, admin)

        async def watch_engine() -> None:
            nonlocal peak_kv
            while not stop.is_set():
                usage, _, _ = await _engine_sample(session, engine)
                peak_kv = max(peak_kv, usage or 0.0)
                await asyncio.sleep(ENGINE_POLL_SECONDS)

        async def watch_sidecar() -> None:
            nonlocal max_queue
            while admin is not None and not stop.is_set():
                async with session.get(admin + "/status") as response:
                    depth = ((await response.json()).get("admission") or {}).get("queue_depth") or {}
                max_queue = max(max_queue, sum(depth.values()))
                await asyncio.sleep(0.25)

        async def one(p: Planned, body: dict[str, Any]) -> Client:
            await asyncio.sleep(max(0.0, started + p.at - time.monotonic()))
            first = await _attempt(session, target, body, shape.request_timeout)
            client = Client(p.kind.name, p.stream, first)
            if shape.retry_once and first.status in {429, 503} and first.retry_after is not None:
                await asyncio.sleep(first.retry_after)
                client.retry = await _attempt(session, target, body, shape.request_timeout)
            return client

        watchers = [asyncio.create_task(watch_engine()), asyncio.create_task(watch_sidecar())]
        started = time.monotonic()
        clients = await asyncio.gather(*(one(p, b) for p, b in zip(planned, bodies, strict=True)))
        ended = max((c.first.ended_at for c in clients), default=started)  # the spike itself
        ended_retries = max((a.ended_at for c in clients for a in (c.first, c.retry) if a), default=started)
        stop.set()
        await asyncio.gather(*watchers, return_exceptions=True)
        after, scrapes_after = await engine_snapshot(session, engine), await sidecar_scrapes(session, admin)
    first_send = started + min((p.at for p in planned), default=0.0)
    preemptions = (after.preemptions_total or 0) - (before.preemptions_total or 0)
    steps_before, steps_after = before.iterations_total, after.iterations_total
    return summarize(shape, clients, preemptions, peak_kv, ended - first_send) | {
        "makespan_with_retries": ended_retries - first_send,
        "max_queue_depth": max_queue if admin else None,
        "engine_steps": None if steps_after is None or steps_before is None else steps_after - steps_before,
        "sidecar_scrapes": None
        if scrapes_after is None or scrapes_before is None
        else scrapes_after - scrapes_before,
        "clients": [asdict(c) for c in clients],
    }


def summarize(
    shape: Shape, clients: list[Client], preemptions: float, peak_kv: float, makespan: float
) -> dict[str, Any]:
    """One run's metrics."""
    attempts = [a for c in clients for a in (c.first, c.retry) if a is not None]
    refusals = [a for a in attempts if a.status in {429, 503} and a.reason]
    retry_after = [int(v) if v.is_integer() else v for a in refusals if (v := a.retry_after) is not None]
    ok = [(c.kind, c.final) for c in clients if c.final.ok]

    def latencies(kind: str | None) -> list[float]:
        return [a.latency for k, a in ok if kind is None or k == kind]

    retried = [c for c in clients if c.retry is not None]
    lengths = [a.tokens for _, a in ok if a.tokens is not None]
    return {
        "sent": len(clients),
        "completed": len(ok),
        "refused": sum(c.first.status != 200 and c.first.reason is not None for c in clients),
        "retry_after": sorted(set(retry_after)),
        "retry_after_median": statistics.median(retry_after) if retry_after else None,
        "all_refusals_retry_after": all(a.retry_after is not None for a in refusals) if refusals else None,
        "lost": sum(not c.final.ok and not c.final.reason for c in clients),
        "preemptions": preemptions,
        "peak_kv_usage": peak_kv,
        "short_p95": percentile(latencies(shape.short_kind), 0.95),
        "long_p50": percentile(latencies(shape.long_kind), 0.5),
        "makespan": makespan,
        "answer_tokens": [percentile(lengths, q) for q in (0.1, 0.5, 0.9)] if lengths else None,
        "streamed": sum(c.stream for c in clients),
        "retried": len(retried),
        "retry_admitted_share": sum(c.final.ok for c in retried) / len(retried) if retried else None,
        "admitted_max_latency": max((a.latency for _, a in ok), default=None),
        "mean_latency": statistics.fmean(a.latency for _, a in ok) if ok else None,
        "errors": sorted({a.error for a in attempts if a.error})[:5],
    }
