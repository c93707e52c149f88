"""How fast a gateway's scrape of the traffic port is answered while the proxy carries load.

Run: ``.venv/bin/python -m bench.gateway_metrics [--seconds 5] [--rounds 3] [--connections 8]
[--engine fast|vllm] [--client raw|aiohttp]``.

An inference gateway's endpoint picker scrapes every pod's traffic port for ``/metrics`` every
50 ms and, with flow control on, treats figures older than 200 ms as saturation. This starts the
fast upstream (``bench.fast_upstream``: a recorded real vLLM 0.32 page, 46 KB) and ``kv-sidecar run``
in front of it, then per round, side by side: the scrape latency of the upstream's own page
(``direct``) and of the sidecar's proxy port, each idle and while a separate process keeps
``--connections`` keep-alive connections of completions going through the sidecar. The proxy port is
scraped twice: ``sidecar``, a connection that only scrapes, as the EPP's (the connection guard answers it
where its bytes arrive, ``sidecar/server/scrape_path.py``), and ``sidecar-aiohttp``, a connection that
carried one other request first, so its scrapes take the proxy application's route through aiohttp.
The scraper polls like the EPP: one GET every 50 ms on a kept-alive connection, by default from a bare
socket (``--client raw``: the EPP's Go client costs microseconds; aiohttp's client would cost about as
much as the answer). The table reports medians over rounds of p50, p99 and max in milliseconds.

``--engine fast`` (the default) is the worst case for the sidecar: the fast upstream answers at once,
so eight connections keep the proxy's event loop busy all the time (~1,300 requests a second here).
``--engine vllm`` puts the real vLLM CPU server (the tiny generated model, ``tests/harness/vllm.py``)
behind it, as a user would: eight connections of real completions (fresh random prompts, 64 tokens
out), the proxy mostly waiting on the engine, the engine using the machine's cores. It adds a control,
``static``: a plain aiohttp server answering a recorded 46 KB page from memory (``bench.fast_upstream``),
scraped under the same load, so the table shows what this machine gives any Python server's page.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from bench.proxy_overhead import RESULTS, free_port, start, stop_all, throughput, wait_ready
from tests.harness.vllm import VllmServer, make_tiny_model, vllm_python

POLL_SECONDS = 0.05  # the EPP's default refresh interval


def raw_scrape_latencies(url: str, seconds: float, *, first: str | None = None) -> list[float]:
    """As :func:`scrape_latencies`, with a blocking socket and no HTTP library (run it in a thread).

    The EPP is a Go program; its client costs microseconds a scrape. aiohttp's client costs about as much as
    the answer itself on this machine (both sides are Python), so this poller writes the request line and
    reads ``Content-Length`` bytes, nothing more: what it measures is the server's answer and the loopback.
    ``first``: a path to GET once before polling, on the same connection (``sidecar-aiohttp``: a connection
    that carried another request is the proxy application's, so its scrapes take aiohttp's route).
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode()
    out: list[float] = []
    with socket.create_connection((host, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffered = b""
        if first is not None:
            buffered = _raw_get(sock, f"GET {first} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode(), b"")
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            buffered = _raw_get(sock, request, buffered)
            out.append(time.perf_counter() - started)
            time.sleep(max(0.0, POLL_SECONDS - (time.perf_counter() - started)))
    return out


def _raw_get(sock: socket.socket, request: bytes, buffered: bytes) -> bytes:
    """Send ``request`` and read its whole answer; the bytes read past it."""
    sock.sendall(request)
    while b"\r\n\r\n" not in buffered:
        buffered += sock.recv(65536)
    head, _, buffered = buffered.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )  # fmt: skip
    while len(buffered) < length:
        buffered += sock.recv(262144)
    return buffered[length:]


async def scrape_latencies(url: str, seconds: float) -> list[float]:
    """GET ``url`` every 50 ms for ``seconds``; the latency of each, body read in full."""
    out: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            async with session.get(url) as response:
                await response.read()
            out.append(time.perf_counter() - started)
            await asyncio.sleep(max(0.0, POLL_SECONDS - (time.perf_counter() - started)))
    return out


def start_load(url: str, seconds: float, connections: int, *, real: bool = False) -> subprocess.Popen[bytes]:
    """A separate process keeping ``connections`` connections of completions going for ``seconds``."""
    code = (
        "import asyncio, sys; from bench.gateway_metrics import real_throughput; "
        f"print(asyncio.run(real_throughput({url!r}, {seconds!r}, {connections!r})))"
        if real
        else "import asyncio, sys; from bench.proxy_overhead import throughput; "
        f"print(asyncio.run(throughput({url!r}, {seconds!r}, {connections!r})))"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


async def real_throughput(url: str, seconds: float, connections: int) -> float:
    """Completions per second against a real engine: fresh random 100-token prompts, 64 tokens out."""
    rng = random.Random()
    done = 0
    deadline = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                body = {
                    "model": "tiny",
                    "prompt": [rng.randrange(1, 500) for _ in range(100)],
                    "max_tokens": 64,
                }
                async with session.post(url + "/v1/completions", json=body) as response:
                    await response.read()
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return done / (time.perf_counter() - started)


def summary(latencies: list[float]) -> dict[str, float]:
    """p50, p99 and max of one series."""
    return {
        "p50": statistics.median(latencies),
        "p99": statistics.quantiles(latencies, n=100)[98],
        "max": max(latencies),
    }


async def run(
    seconds: float, rounds: int, connections: int, engine: str, client: str = "raw"
) -> dict[str, dict[str, float]]:
    """Measure every (target, load) pair per round; medians over rounds."""
    proxy_port, admin_port = free_port(), free_port()
    proxy = f"http://127.0.0.1:{proxy_port}"
    with contextlib.ExitStack() as stack:
        if engine == "vllm":
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kv-sidecar-gateway-")))
            python = vllm_python()
            server = VllmServer(
                python, make_tiny_model(python, workdir / "tiny-model"), log_path=workdir / "vllm.log"
            )
            stack.enter_context(server)
            control_port = free_port()
            control = f"http://127.0.0.1:{control_port}"
            processes = [start([sys.executable, "-m", "bench.fast_upstream", str(control_port)])]
            await wait_ready(control + "/v1/models")
            return await _measure(
                server.url, proxy, admin_port, processes, seconds, rounds, connections,
                real=True, client=client, control=control,
            )  # fmt: skip
        upstream_port = free_port()
        upstream = f"http://127.0.0.1:{upstream_port}"
        processes = [start([sys.executable, "-m", "bench.fast_upstream", str(upstream_port)])]
        await wait_ready(upstream + "/v1/models")
        return await _measure(
            upstream, proxy, admin_port, processes, seconds, rounds, connections, real=False, client=client
        )


async def _measure(
    upstream: str,
    proxy: str,
    admin_port: int,
    processes: list[subprocess.Popen[bytes]],
    seconds: float,
    rounds: int,
    connections: int,
    *,
    real: bool,
    client: str,
    control: str | None = None,
) -> dict[str, dict[str, float]]:
    proxy_port = proxy.rsplit(":", 1)[1]
    processes.append(
        start([sys.executable, "-m", "sidecar", "run", "--upstream", upstream, "--listen", f"127.0.0.1:{proxy_port}",
               "--admin-listen", f"127.0.0.1:{admin_port}", "--nvml", "off", "--log-level", "error"])
    )  # fmt: skip
    samples: dict[str, dict[str, list[float]]] = {}
    try:
        await wait_ready(proxy + "/v1/models")
        if not real:
            await throughput(proxy, 1.0, connections)  # warm both up
        for _ in range(rounds):
            for loaded in (False, True):
                targets: list[tuple[str, str, str | None]] = [
                    ("direct", upstream, None),
                    ("sidecar", proxy, None),
                ]
                if client == "raw":
                    targets.append(("sidecar-aiohttp", proxy, "/v1/models"))
                if control:
                    targets.append(("static", control, None))
                for name, url, first in targets:
                    load = start_load(proxy, seconds + 1.0, connections, real=real) if loaded else None
                    if load is not None:
                        await asyncio.sleep(0.5)
                    row = samples.setdefault(f"{name} {'loaded' if loaded else 'idle'}", {})
                    scraped = (
                        await asyncio.to_thread(raw_scrape_latencies, url + "/metrics", seconds, first=first)
                        if client == "raw"
                        else await scrape_latencies(url + "/metrics", seconds)
                    )
                    for key, value in summary(scraped).items():
                        row.setdefault(key, []).append(value)
                    if load is not None:
                        output, _ = load.communicate(timeout=seconds + 30)
                        row.setdefault("load_rps", []).append(float(output.decode().strip() or 0.0))
        return {name: {k: statistics.median(v) for k, v in row.items()} for name, row in samples.items()}
    finally:
        stop_all(processes)


def main() -> None:
    """Run and print the table; the figures are also written to ``bench/results``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8, help="load connections through the sidecar")
    parser.add_argument("--engine", choices=("fast", "vllm"), default="fast", help="what the sidecar fronts")
    parser.add_argument(
        "--client", choices=("raw", "aiohttp"), default="raw",
        help="the poller: a bare socket, as cheap as the EPP's Go client (default), or aiohttp's",
    )  # fmt: skip
    args = parser.parse_args()
    result = asyncio.run(run(args.seconds, args.rounds, args.connections, args.engine, args.client))
    print(f"{'/metrics of':<24}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'load req/s':>12}")
    for name, row in result.items():
        rps = f"{row['load_rps']:>12.0f}" if "load_rps" in row else f"{'-':>12}"
        print(f"{name:<24}{row['p50'] * 1e3:>8.2f}{row['p99'] * 1e3:>8.2f}{row['max'] * 1e3:>8.2f}{rps}")
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "connections": args.connections,
               "engine": args.engine, "client": args.client}  # fmt: skip
    out = RESULTS / f"gateway_metrics-{stamp}.json"
    out.write_text(json.dumps({"date": stamp, "machine": machine, "results": result}, indent=2) + "\n")
    print(f"written to {out.relative_to(RESULTS.parent.parent)}")


if __name__ == "__main__":
    main()
