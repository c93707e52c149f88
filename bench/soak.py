"""Soak: mixed traffic with pressure cycles through a real ``kv-sidecar run`` process, watching its memory and FDs.

Run: ``.venv/bin/python -m bench.soak --seconds 600`` (the README's 10-minute figures), or ``--engine-url`` to
soak in front of a running real vLLM (the harness's tiny model). The fake engine (``bench.fast_upstream``)
alternates between calm (KV 0.3) and pressure (KV 0.95) every ``--cycle`` seconds. ``--workers`` clients loop
over a mix: short requests, long ones (queued under pressure), streams, streams abandoned mid-way, queued
clients that give up, malformed bodies and never-fitting prompts. Every second the sidecar's RSS
(``/proc/PID/status``) and open file descriptors are sampled.

Pass criteria (exit status 1 otherwise): RSS growth after warm-up (the first quarter, at least 20 s: the
first large bodies start worker threads, the first of each path imports and caches) under 10%, no FD growth
beyond 16, queue and in-flight back to 0 at the end, and the sidecar's outcome counters equal to the
generation requests sent (nothing lost), and no client saw a failure: every answer is what its kind should get
(200, a complete stream, 400 for the malformed and the never-fitting, or a 429/503 refusal carrying
``X-KV-Sidecar-Reason`` and ``Retry-After``), and no connection broke. Results go to ``bench/results/soak-*.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.proxy_overhead import stop_all
from tests.harness.vllm import ROOT, free_port, wait_http

RESULTS = Path(__file__).parent / "results"

WARMUP_SECONDS = 20.0
"""The warm-up before the RSS baseline, at least (a quarter of longer runs)."""


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


REFUSED = "refused"
EXPECTED_400 = {"malformed": "invalid-request", "toolong": "context-length-exceeded"}


def judge(kind: str, status: int, headers: Any, body: bytes | None) -> str | None:
    """What the client saw, judged: ``None`` as expected, :data:`REFUSED` (a refusal done right), or a failure."""
    reason = headers.get("X-KV-Sidecar-Reason")
    if kind in EXPECTED_400:
        expected = EXPECTED_400[kind]
        return (
            None if (status, reason) == (400, expected) else f"{kind}: {status} {reason}, not 400 {expected}"
        )
    if status in {429, 503}:
        if reason and headers.get("Retry-After"):
            return REFUSED
        return f"{kind}: {status} without a reason or Retry-After"
    if status != 200:
        return f"{kind}: {status} {reason}"
    if kind == "stream" and body is not None and not body.rstrip().endswith(b"data: [DONE]"):
        return f"{kind}: a stream cut before [DONE]"
    return None


async def send(
    session: aiohttp.ClientSession, proxy: str, kind: str, body: dict[str, Any], rng: random.Random
) -> str | None:
    """One request of ``kind``, and :func:`judge`'s verdict on what came back."""
    url = proxy + "/v1/completions"
    if kind == "malformed":
        headers = {"Content-Type": "application/json"}
        async with session.post(url, data=b'{"prompt": [1, 2', headers=headers) as r:
            return judge(kind, r.status, r.headers, await r.read())
    if kind == "abandon":
        async with session.post(url, json=body) as r:
            await r.content.readany()  # read one chunk, then go away
            return judge(kind, r.status, r.headers, None)
    if kind == "giveup":
        async with asyncio.timeout(rng.uniform(0.2, 0.6)), session.post(url, json=body) as r:
            return judge(kind, r.status, r.headers, await r.read())
    async with session.post(url, json=body) as r:
        return judge(kind, r.status, r.headers, await r.read())


async def worker(
    session: aiohttp.ClientSession,
    proxy: str,
    deadline: float,
    rng: random.Random,
    tally: dict[str, int],
    failures: list[str],
    fake: bool,
) -> None:
    while time.monotonic() < deadline:
        kind = rng.choices(
            ["short", "long", "stream", "abandon", "giveup", "malformed", "toolong"], [40, 15, 15, 8, 8, 7, 7]
        )[0]
        tally["sent"] += 1
        long_prompt = list(range(20000)) if fake else [rng.randrange(10, 500) for _ in range(600)]
        body: dict[str, Any] = {"model": "tiny", "max_tokens": 16, "prompt": [1, 2, 3, 4]}
        if kind == "long":
            body |= {"prompt": long_prompt, "max_tokens": 200 if fake else 300, "delay": 0.3}
        elif kind in {"stream", "abandon"}:
            body |= {"stream": True, "chunks": 20, "max_tokens": 20}
        elif kind == "giveup":
            body |= {"prompt": long_prompt, "max_tokens": 200 if fake else 300, "delay": 0.3}
        elif kind == "toolong":
            body |= {"prompt": list(range(40000 if fake else 2000)), "max_tokens": 16}
        if not fake:
            body.pop("delay", None)
            body.pop("chunks", None)
            body["ignore_eos"] = True
        try:
            failure = await send(session, proxy, kind, body, rng)
            tally[kind] += 1
        except TimeoutError:
            tally["gave_up"] += 1
            continue
        except aiohttp.ClientError as exc:
            tally["client_errors"] += 1
            failure = f"{kind}: {type(exc).__name__}: {exc}"
        if failure == REFUSED:
            tally["refused_with_retry_after"] += 1
        elif failure is not None:
            tally["client_failures"] += 1
            if len(failures) < 10:
                failures.append(failure)


async def sidecar_counts(admin: str) -> tuple[float, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(admin + "/metrics") as response:
            text = await response.text()
        async with session.get(admin + "/status") as response:
            status = await response.json()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("kv_sidecar_admission_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total, status


async def soak(
    seconds: float, workers: int, cycle: float, engine_url: str | None, seed: int
) -> dict[str, Any]:
    processes: list[subprocess.Popen[bytes]] = []
    if engine_url is None:
        port = free_port()
        engine_url = f"http://127.0.0.1:{port}"
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "bench.fast_upstream", str(port), f"cycle:{cycle}"], cwd=ROOT
            )
        )
        fake = True
    else:
        fake = False
    await wait_http(engine_url + "/v1/models")
    proxy_port, admin_port = free_port(), free_port()
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "run", "--upstream", engine_url, "--listen", f"127.0.0.1:{proxy_port}",
         "--admin-listen", f"127.0.0.1:{admin_port}", "--nvml", "off", "--log-level", "warning",
         "--scrape-interval", "200ms", "--pressure-window", "1s", "--queue-timeout", "5s", "--drain-timeout", "10s"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    processes.append(sidecar)
    proxy, admin = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{admin_port}"
    try:
        await wait_http(admin + "/healthz")
        await asyncio.sleep(1.0)
        rng = random.Random(seed)
        tally: dict[str, int] = dict.fromkeys(
            [
                "sent",
                "short",
                "long",
                "stream",
                "abandon",
                "giveup",
                "malformed",
                "toolong",
                "gave_up",
                "client_errors",
                "client_failures",
                "refused_with_retry_after",
            ],
            0,
        )
        failures: list[str] = []
        samples: list[tuple[float, int, int]] = []
        started = time.monotonic()
        deadline = started + seconds

        async def sample() -> None:
            while time.monotonic() < deadline:
                samples.append((time.monotonic() - started, rss_bytes(sidecar.pid), open_fds(sidecar.pid)))
                await asyncio.sleep(1.0)

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await asyncio.gather(
                sample(),
                *(
                    worker(session, proxy, deadline, random.Random(rng.random()), tally, failures, fake)
                    for _ in range(workers)
                ),
            )
        settle_deadline = time.monotonic() + 30
        while True:
            counted, status = await sidecar_counts(admin)
            admission = status["admission"]
            idle = sum(admission["queue_depth"].values()) == 0 and sum(admission["inflight"].values()) == 0
            if (idle and counted == tally["sent"]) or time.monotonic() > settle_deadline:
                break
            await asyncio.sleep(0.2)
        final_rss, final_fds = rss_bytes(sidecar.pid), open_fds(sidecar.pid)
    finally:
        stop_all(list(reversed(processes)))  # the sidecar first: it drains before the engine goes
    warm = [s for s in samples if s[0] >= max(seconds / 4, min(WARMUP_SECONDS, seconds / 2))]
    baseline_rss = statistics.median(s[1] for s in warm[: max(1, len(warm) // 5)])
    baseline_fds = min(s[2] for s in warm)
    peak_rss = max(s[1] for s in warm)
    result = {
        "seconds": seconds,
        "engine": "fake (pressure cycles)" if fake else engine_url,
        "workers": workers,
        "requests": tally,
        "sidecar_counted": counted,
        "lost": tally["sent"] - counted,
        "client_failures": tally["client_failures"],
        "failure_examples": failures,
        "queue_and_inflight_at_end": 0 if idle else "not idle",
        "rss_after_warmup_mib": baseline_rss / 2**20,
        "rss_peak_mib": peak_rss / 2**20,
        "rss_end_mib": final_rss / 2**20,
        "rss_growth": (final_rss - baseline_rss) / baseline_rss,
        "fds_after_warmup": baseline_fds,
        "fds_end": final_fds,
        "sidecar_exit": sidecar.returncode,
        "rss_series_mib": [(round(t, 1), round(rss / 2**20, 1)) for t, rss, _ in samples],
    }
    result["passed"] = bool(
        result["rss_growth"] < 0.10
        and final_fds - baseline_fds <= 16
        and idle
        and result["lost"] == 0
        and result["client_failures"] == 0
        and sidecar.returncode == 0
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument(
        "--cycle", type=float, default=10.0, help="seconds of calm, then of pressure, alternating"
    )
    parser.add_argument("--engine-url", help="soak in front of a running (real) vLLM instead of the fake")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the result here too")
    args = parser.parse_args()
    result = asyncio.run(soak(args.seconds, args.workers, args.cycle, args.engine_url, args.seed))
    for key, value in result.items():
        print(f"{key:<28}{value}")
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps({"date": stamp, **result}, indent=2)
    (RESULTS / f"soak-{stamp}.json").write_text(text)
    if args.json:
        args.json.write_text(text)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
