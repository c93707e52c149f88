"""The admission suite: five traffic shapes, each straight to vLLM and through a fresh ``kv-sidecar run``.

Run: ``.venv/bin/python -m bench.admission_suite`` (``make bench-admission``). It starts one vLLM CPU
server with the harness defaults (16 blocks x 128 tokens = 2,048-token pool, 4 sequences, max_model_len
1024; ``VLLM_SERVER_DEV_MODE=1`` so ``POST /reset_prefix_cache`` exists) unless ``--engine-url`` is given.
For every shape and round it sends the same traffic twice, direct and through a sidecar started for that run
alone (no admission flags: add some with ``--sidecar-arg=--admission --sidecar-arg=lanes``), alternating
which goes first per round. Before each run it waits for vLLM to be idle and resets its prefix cache, so no
run rides on blocks an earlier one left cached (the summary says if a reset failed). Both targets of a round get
the same traffic: sizes, kinds, arrival times, token-id prompts and sampling seeds (seed ``base*1000 + round``),
fresh per round; with random weights the answers' lengths depend on the prompt and seed, so drawing them per
run compared different work (the generous-max-tokens shape's answers differed by up to 25% at p90 between the
two targets of one round).

Shapes (``/v1/completions``, temperature 0, ``ignore_eos`` unless said):

- ``long-prompt``: 8 long (600-token prompt, 400 out) + 24 short (24 in, 16 out) over 2 s, shuffled.
- ``mid-size``: 16 mid (300-450 in, 300 out) + 16 short over 2 s; every prompt below the 512-token long line.
- ``generous-max-tokens``: 40 (80-120 in, max_tokens 900, temperature 1, a seed each, 8 stop token ids so
  random weights stop early: median ~40-60 tokens), half of them streamed (SSE read to ``[DONE]``).
- ``shared-prefix``: 24 requests sharing one 512-token prefix (fresh per run) + 40-80 own tokens, 100 out.
- ``sustained-overload``: open-loop Poisson at 20 req/s (``--overload-rate``) for ``--overload-seconds`` (75% short, 25% 300+200),
  120 s client timeout; a 429/503 with Retry-After is retried once after exactly that wait. On 2 cores vLLM
  serves ~10-12 req/s of this mix (at 6 req/s shorts still finish in 0.1 s, at 20 the backlog grows).

Per run: sent, completed, refused (non-200 with ``X-KV-Sidecar-Reason``), their Retry-After values, lost
(everything else: no answer, a bare error, a cut stream), vLLM preemptions, peak ``vllm:kv_cache_usage_perc``,
short p95, long/mid p50, makespan, answer lengths, the sidecar's peak queue depth and, with retries, the
retried share admitted. Latencies are per attempt. The machine's two cores are shared with vLLM's
busy-polling engine: compare the columns of one run, not absolute times. Raw results go to
``bench/results/admission-*.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import aiohttp

from tests.harness.spike import ENGINE_POLL_SECONDS, RESULTS, _engine_sample, _fmt, wait_idle
from tests.harness.vllm import ROOT, VllmServer, free_port, make_tiny_model, vllm_python

STOP_IDS = (11, 77, 131, 199, 263, 317, 401, 463)


@dataclass(frozen=True)
class Kind:
    """One kind of request in a shape (``count`` is a weight in an open-loop shape)."""

    name: str  # "short" / "long" / ...: what Shape.short_kind and long_kind name
    count: int  # requests of this kind in a burst; the mix's weight in an open-loop shape
    prompt: tuple[int, int]  # prompt tokens, uniform in [low, high]
    max_tokens: int
    ignore_eos: bool = True
    temperature: float = 0.0  # > 0: each request also carries a "seed"
    stream_share: float = 0.0  # every round(1 / share)-th request of the kind streams
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Shape:
    """A traffic shape: a burst spread over ``spread_seconds``, or open-loop Poisson when ``seconds`` > 0."""

    name: str
    kinds: tuple[Kind, ...]
    spread_seconds: float = 2.0  # a burst's arrivals, uniform over this many seconds
    shared_prefix: int = 0  # tokens every request of a run starts with (fresh per run)
    short_kind: str | None = "short"  # whose p95 is "short p95" (None: all requests)
    long_kind: str | None = "long"  # whose p50 is "long/mid p50" (None: all requests)
    seconds: float = 0.0  # > 0: open-loop Poisson arrivals for this long, at ``rate`` per second
    rate: float = 0.0
    retry_once: bool = False  # a 429/503 with Retry-After: wait exactly that, retry once
    request_timeout: float = 180.0  # per attempt, client side


SHORT = Kind("short", 24, (24, 24), 16)
SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("long-prompt", (Kind("long", 8, (600, 600), 400), SHORT)),
    Shape("mid-size", (Kind("mid", 16, (300, 450), 300), dataclasses.replace(SHORT, count=16)), long_kind="mid"),
    Shape("generous-max-tokens", (Kind("gen", 40, (80, 120), 900, False, 1.0, 0.5, STOP_IDS),),
          short_kind=None, long_kind="gen"),
    Shape("shared-prefix", (Kind("shared", 24, (40, 80), 100),), shared_prefix=512, short_kind=None,
          long_kind="shared"),
    Shape("sustained-overload", (dataclasses.replace(SHORT, count=3), Kind("mid", 1, (300, 300), 200)),
          long_kind="mid", seconds=60.0, rate=20.0, retry_once=True, request_timeout=120.0),
)}  # fmt: skip


@dataclass(frozen=True)
class Planned:
    """One client of a run: when it sends and what (its tokens are drawn per run)."""

    kind: Kind
    at: float
    prompt_len: int
    stream: bool
    seed: int


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


def plan(shape: Shape, seed: str) -> list[Planned]:
    """The kinds, sizes and arrival times of one round (the same for both targets)."""
    rng = random.Random(seed)
    if shape.seconds > 0:
        kinds, at, starts = [], rng.expovariate(shape.rate), []
        while at < shape.seconds:
            kinds.append(rng.choices(shape.kinds, weights=[k.count for k in shape.kinds])[0])
            starts.append(at)
            at += rng.expovariate(shape.rate)
    else:
        kinds = [k for k in shape.kinds for _ in range(k.count)]
        rng.shuffle(kinds)
        starts = sorted(rng.uniform(0, shape.spread_seconds) for _ in kinds)
    streamed: dict[str, int] = {}
    out = []
    for i, (kind, start) in enumerate(zip(kinds, starts, strict=True)):
        streamed[kind.name] = streamed.get(kind.name, 0) + 1
        stream = kind.stream_share > 0 and streamed[kind.name] % round(1 / kind.stream_share) == 0
        out.append(Planned(kind, start, rng.randint(*kind.prompt), stream, i))
    return out


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
        _, preempt_before, _ = await _engine_sample(session, engine)

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
        _, preempt_after, _ = await _engine_sample(session, engine)
    first_send = started + min((p.at for p in planned), default=0.0)
    preemptions = (preempt_after or 0) - (preempt_before or 0)
    return summarize(shape, clients, preemptions, peak_kv, ended - first_send) | {
        "makespan_with_retries": ended_retries - first_send,
        "max_queue_depth": max_queue if admin else None,
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
        "errors": sorted({a.error for a in attempts if a.error})[:5],
    }


def start_sidecar(
    engine: str, model: Path, extra: list[str], log: IO[bytes]
) -> tuple[subprocess.Popen[bytes], str, str]:
    """A fresh ``kv-sidecar run`` (no admission flags but ``extra``); the process, proxy and admin URLs."""
    port, admin = free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "run", "--upstream", engine, "--listen", f"127.0.0.1:{port}",
         "--admin-listen", f"127.0.0.1:{admin}", "--model", str(model), "--gpu-memory", "24GiB", "--nvml", "off",
         "--log-level", "warning", *extra],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    return process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to its own pid, then wait (kill after 40 s)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


async def reset_prefix_cache(engine: str) -> bool:
    """``POST /reset_prefix_cache`` (vLLM serves it with ``VLLM_SERVER_DEV_MODE=1``); whether it answered 200."""
    async with aiohttp.ClientSession() as session, session.post(engine + "/reset_prefix_cache") as response:
        return response.status == 200


async def wait_sidecar(process: subprocess.Popen[bytes], admin: str, within: float = 60.0) -> dict[str, Any]:
    """Until ``/healthz`` answers and ``/status`` has seen vLLM up (that status); fails fast if it exits."""
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                async with session.get(admin + "/healthz") as health:
                    healthy = health.status == 200
                if healthy:
                    async with session.get(admin + "/status") as response:
                        status: dict[str, Any] = await response.json()
                        if status.get("engine", {}).get("up"):
                            return status
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    exited = process.poll() is not None
    raise RuntimeError(
        f"the sidecar exited ({process.returncode})" if exited else f"no healthy sidecar in {within:g}s"
    )


def tail(path: Path, chars: int = 2000) -> str:
    """The end of a log file."""
    return path.read_text(errors="replace")[-chars:]


async def through_sidecar(
    engine: str, model: Path, extra: list[str], log_path: Path, shape: Shape, planned: list[Planned], token_seed: int
) -> dict[str, Any]:  # fmt: skip
    """One run through a sidecar started for it alone (stopped after; its log in ``log_path``)."""
    with log_path.open("wb") as log:
        process, proxy, admin = start_sidecar(engine, model, extra, log)
        try:
            status = await wait_sidecar(process, admin)
            summary = await run_once(proxy, engine, shape, planned, token_seed, admin)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; sidecar log: {tail(log_path)}") from exc
        finally:
            stop_process(process)
    return summary | {"sidecar_admission_at_start": status.get("admission"), "sidecar_log": tail(log_path)}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each metric's median over rounds (lists: the union; flags: all)."""
    out: dict[str, Any] = {}
    skip = {"clients", "round", "token_seed", "sidecar_admission_at_start", "sidecar_log"}
    for key in (k for k in runs[0] if k not in skip):
        values = [r[key] for r in runs if r[key] is not None]
        if key in {"errors", "retry_after"}:
            out[key] = sorted({v for vs in values for v in vs})
        elif key == "answer_tokens":
            middle = [statistics.median(v[i] for v in values) for i in range(3)] if values else None
            out[key] = [int(m) if float(m).is_integer() else m for m in middle] if middle else None
        elif key == "all_refusals_retry_after":
            out[key] = all(values) if values else None
        else:
            out[key] = statistics.median(values) if values else None
    return out


async def run_suite(
    engine_url: str, model: Path, shapes: list[Shape], rounds: int, sidecar_args: list[str],
    seed: int = 7, progress: bool = True, workdir: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Every shape ``rounds`` times, direct and through a fresh sidecar per run; raw runs and medians."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="kv-sidecar-admission-"))
    result: dict[str, Any] = {"engine_url": engine_url, "sidecar_args": sidecar_args, "seed": seed, "rounds": rounds,
                              "prefix_cache_reset": True, "shapes": {}}  # fmt: skip
    run_index = 0
    if progress:
        print(f"  sidecar logs in {workdir}", flush=True)
    for shape in shapes:
        runs: dict[str, list[dict[str, Any]]] = {"direct": [], "sidecar": []}
        for round_ in range(rounds):
            planned = plan(shape, f"{seed}-{shape.name}-{round_}")
            for target in ("direct", "sidecar") if round_ % 2 == 0 else ("sidecar", "direct"):
                await wait_idle(engine_url)
                result["prefix_cache_reset"] &= await reset_prefix_cache(engine_url)
                run_index += 1
                token_seed = seed * 1000 + round_  # the same prompts and sampling seeds for both targets
                if progress:
                    print(
                        f"  {shape.name} round {round_ + 1}/{rounds} {target} ({len(planned)} requests)",
                        flush=True,
                    )
                if target == "direct":
                    summary = await run_once(engine_url, engine_url, shape, planned, token_seed)
                else:
                    log_path = workdir / f"sidecar-{run_index}.log"
                    summary = await through_sidecar(
                        engine_url, model, sidecar_args, log_path, shape, planned, token_seed
                    )
                runs[target].append(summary | {"round": round_, "token_seed": token_seed})
        median = {target: medians(target_runs) for target, target_runs in runs.items()}
        paired = {key: paired_ratios(runs, key) for key in ("short_p95", "makespan")}
        result["shapes"][shape.name] = {
            "shape": asdict(shape),
            "runs": runs,
            "median": median,
            "paired": paired,
        }
        if progress:
            print_shape(shape.name, result["shapes"][shape.name]["median"])
    return result


def paired_ratios(runs: dict[str, list[dict[str, Any]]], key: str) -> list[float]:
    """Sidecar over straight for ``key``, round by round (the two runs of a round are back to back).

    This VM's speed drifts by up to 2x between minutes; a round's two runs share the drift, so the
    median of the per-round ratios is the steadier comparison (the medians of each column are reported too).
    """
    return [
        s[key] / d[key]
        for d, s in zip(runs["direct"], runs["sidecar"], strict=True)
        if d[key] and s[key] is not None
    ]


ROWS = [
    ("requests sent", "sent", "{:.0f}"), ("completed", "completed", "{:.0f}"), ("refused", "refused", "{:.0f}"),
    ("  Retry-After values (s)", "retry_after", "{}"), ("  Retry-After median (s)", "retry_after_median", "{:.0f}"),
    ("  every 429/503 had one", "all_refusals_retry_after", "{}"), ("lost", "lost", "{:.0f}"),
    ("vLLM preemptions", "preemptions", "{:.0f}"), ("peak KV usage", "peak_kv_usage", "{:.0%}"),
    ("short p95 (s; all if no short)", "short_p95", "{:.2f}"), ("long/mid p50 (s)", "long_p50", "{:.2f}"),
    ("makespan (s)", "makespan", "{:.1f}"), ("  with the retries (s)", "makespan_with_retries", "{:.1f}"),
    ("answer tokens p10,p50,p90", "answer_tokens", "{}"),
    ("streamed", "streamed", "{:.0f}"), ("max sidecar queue depth", "max_queue_depth", "{:.0f}"),
    ("retried after Retry-After", "retried", "{:.0f}"), ("  share admitted", "retry_admitted_share", "{:.0%}"),
    ("admitted max latency (s)", "admitted_max_latency", "{:.1f}"),
]  # fmt: skip


def print_shape(name: str, columns: dict[str, dict[str, Any]]) -> None:
    """One shape's side-by-side table (rows: metrics; columns: direct, sidecar)."""
    print(f"\n{name:<32}" + "".join(f"{t:>16}" for t in columns))
    for title, key, pattern in ROWS:
        cells = [
            _fmt(col[key], pattern) if not isinstance(col[key], bool) else str(col[key]).lower()
            for col in columns.values()
        ]
        print(f"{title:<32}" + "".join(f"{c:>16}" for c in cells))
    errors = sorted({e for col in columns.values() for e in col["errors"]})
    if errors:
        print("  errors: " + "; ".join(errors))


def print_summary(result: dict[str, Any]) -> None:
    """A row per shape: direct -> sidecar."""

    def arrow(d: Any, s: Any, pattern: str) -> str:
        return f"{_fmt(d, pattern)}->{_fmt(s, pattern)}"

    def ratio(d: float | None, s: float | None) -> str:
        return f"{s / d:.2f}x" if d and s is not None else "-"

    def paired(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}x" if values else "-"

    print(f"\n{'shape':<22}{'preempt d->s':>14}{'short p95 d->s':>16}{'ratio':>8}{'paired':>8}{'makespan s/d':>14}"
          f"{'paired':>8}{'lost d/s':>10}{'refused (R-A)':>16}")  # fmt: skip
    for name, entry in result["shapes"].items():
        d, s = entry["median"]["direct"], entry["median"]["sidecar"]
        retry_after = {True: "yes", False: "no", None: "-"}[s["all_refusals_retry_after"]]
        print(
            f"{name:<22}{arrow(d['preemptions'], s['preemptions'], '{:.0f}'):>14}"
            f"{arrow(d['short_p95'], s['short_p95'], '{:.2f}'):>16}{ratio(d['short_p95'], s['short_p95']):>8}"
            f"{paired(entry['paired']['short_p95']):>8}{ratio(d['makespan'], s['makespan']):>14}"
            f"{paired(entry['paired']['makespan']):>8}{_fmt(d['lost'], '{:.0f}') + '/' + _fmt(s['lost'], '{:.0f}'):>10}"
            f"{_fmt(s['refused'], '{:.0f}') + f' ({retry_after})':>16}"
        )
    if not result["prefix_cache_reset"]:
        print("(vLLM did not answer 200 to POST /reset_prefix_cache: fresh prompts alone kept runs apart)")


def main() -> None:
    # fmt: off
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of: " + ", ".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=1, help="repeat each shape (medians reported)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--overload-seconds", type=float, default=60.0)
    parser.add_argument("--overload-rate", type=float, default=SHAPES["sustained-overload"].rate,
                        help="arrivals per second of the sustained overload (default %(default)s)")
    parser.add_argument("--engine-url", help="use a running vLLM (started with the harness's settings)")
    parser.add_argument("--sidecar-arg", action="append", default=[], help="extra `kv-sidecar run` argument (repeatable)")
    parser.add_argument("--max-num-seqs", type=int, default=4,
                        help="vLLM's --max-num-seqs, told to the sidecar as the Helm chart does (the harness starts 4)")
    parser.add_argument("--quiet", action="store_true")
    # fmt: on
    args = parser.parse_args()
    unknown = [n for n in args.shapes.split(",") if n not in SHAPES]
    if unknown:
        parser.error(f"unknown shapes: {', '.join(unknown)}")
    shapes = [SHAPES[n] for n in args.shapes.split(",")]
    shapes = [
        dataclasses.replace(s, seconds=args.overload_seconds, rate=args.overload_rate) if s.seconds > 0 else s
        for s in shapes
    ]
    workdir = Path(tempfile.mkdtemp(prefix="kv-sidecar-admission-"))
    python = vllm_python()
    model = make_tiny_model(python, workdir / "tiny-model")
    server: VllmServer | None = None
    if args.engine_url is None:
        os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")  # serves POST /reset_prefix_cache
        if not args.quiet:
            print(f"starting vLLM (about a minute; log: {workdir / 'vllm.log'})", flush=True)
        server = VllmServer(python, model, log_path=workdir / "vllm.log")
        server.start()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    try:
        result = asyncio.run(
            run_suite(server.url if server else args.engine_url, model, shapes, args.rounds,
                      ["--max-num-seqs", str(args.max_num_seqs), *args.sidecar_arg], seed=args.seed,
                      progress=not args.quiet, workdir=workdir)
        )  # fmt: skip
    finally:
        if server is not None:
            server.stop()
    if args.quiet:
        for name, entry in result["shapes"].items():
            print_shape(name, entry["median"])
    print_summary(result)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"admission-{stamp}.json"
    out.write_text(
        json.dumps({"date": stamp, "shapes_config": [asdict(s) for s in shapes], **result}, indent=2)
    )
    print(f"\nwritten {out}")


if __name__ == "__main__":
    main()
