"""What the sidecar's proxy costs, measured side by side in one run against the same fast upstream.

Run: ``.venv/bin/python -m bench.proxy_overhead [--seconds 3] [--rounds 3]``.

Targets (processes on loopback): ``direct`` (the fast upstream itself), ``sidecar`` (``kv-sidecar run``
in front of it, default flags), ``bare`` (a 40-line streaming aiohttp pass-through),
``buffered`` (the thinnest buffered aiohttp pass-through: ``await upstream.read()`` into one response) and ``nginx`` as a reverse proxy when an ``nginx`` binary is installed (Debian's
``nginx-light``; buffering off, upstream keep-alive). Each round measures every target in turn, so machine noise hits all of them alike;
the table reports medians over rounds.

* ``added p50/p99 ms`` at 1 connection: the latency a non-streaming request gains over ``direct``.
* ``req/s`` at 1 and 8 connections, and the sidecar's share of ``bare``'s throughput.
* ``first chunk ms``: time from the upstream sending a stream's first SSE event to the client
  receiving it (the event carries its send time; ``time.monotonic`` is system-wide on Linux).
* ``CPU us/req @8``: the target process's own CPU (user + system, ``/proc``) per request during the
  8-connection run: steadier than req/s on a shared 2-core machine, where the load generator, the
  upstream and the proxy compete for the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from tests.harness.admission_runs import process_cpu_seconds

ROOT = Path(__file__).parent.parent
RESULTS = Path(__file__).parent / "results"
BODY = {"model": "bench", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": 8}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url) as response:
                    if response.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def latencies(url: str, seconds: float) -> list[float]:
    """Sequential requests on one keep-alive connection for ``seconds``."""
    out: list[float] = []
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            async with session.post(url + "/v1/completions", json=BODY) as response:
                await response.read()
            out.append(time.perf_counter() - started)
    return out


async def throughput(url: str, seconds: float, connections: int, counted: list[int] | None = None) -> float:
    """Requests per second with ``connections`` concurrent keep-alive connections (``counted`` gets the count)."""
    done = 0
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.post(url + "/v1/completions", json=BODY) as response:
                    await response.read()
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        if counted is not None:
            counted.append(done)
        return done / (time.perf_counter() - started)


async def first_chunk_delays(url: str, count: int) -> list[float]:
    out = []
    async with aiohttp.ClientSession() as session:
        for _ in range(count):
            async with session.post(
                url + "/v1/completions", json={**BODY, "stream": True, "chunks": 4}
            ) as response:
                first = await response.content.readuntil(b"\n\n")
                received = time.monotonic()
                sent = json.loads(first.decode().removeprefix("data: "))["sent"]
                out.append(received - sent)
                await response.read()
    return out


NGINX_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log error;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    upstream engine {{ server 127.0.0.1:{upstream}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def start_nginx(port: int, upstream_port: int) -> subprocess.Popen[bytes] | None:
    """nginx as a reverse proxy, when installed; ``None`` otherwise."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        return None
    workdir = Path(tempfile.mkdtemp(prefix="kv-sidecar-nginx-"))
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, port=port, upstream=upstream_port))
    return start([binary, "-c", str(conf), "-p", str(workdir), "-g", "daemon off;"])


def stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process, then wait for each (killed after 40 s)."""
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()


def start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def run(seconds: float, rounds: int) -> dict[str, dict[str, float]]:
    upstream_port, sidecar_port, admin_port, bare_port, buffered_port = (free_port() for _ in range(5))
    upstream = f"http://127.0.0.1:{upstream_port}"
    processes = [start([sys.executable, "-m", "bench.fast_upstream", str(upstream_port)])]
    await wait_ready(upstream + "/v1/models")
    processes.append(
        start([sys.executable, "-m", "sidecar", "run", "--upstream", upstream, "--listen", f"127.0.0.1:{sidecar_port}",
               "--admin-listen", f"127.0.0.1:{admin_port}", "--nvml", "off", "--log-level", "error"])
    )  # fmt: skip
    processes.append(start([sys.executable, "-m", "bench.bare_proxy", str(bare_port), upstream]))
    processes.append(
        start([sys.executable, "-m", "bench.bare_proxy", str(buffered_port), upstream, "--buffered"])
    )
    pids = {"direct": processes[0].pid, "sidecar": processes[1].pid, "bare": processes[2].pid,
            "buffered": processes[3].pid}  # fmt: skip
    targets = {
        "direct": upstream,
        "sidecar": f"http://127.0.0.1:{sidecar_port}",
        "bare": f"http://127.0.0.1:{bare_port}",
        "buffered": f"http://127.0.0.1:{buffered_port}",
    }
    nginx_port = free_port()
    nginx = start_nginx(nginx_port, upstream_port)
    if nginx is not None:
        processes.append(nginx)
        targets["nginx"] = f"http://127.0.0.1:{nginx_port}"
    try:
        for url in targets.values():
            await wait_ready(url + "/v1/models")
        samples: dict[str, dict[str, list[float]]] = {name: {} for name in targets}
        for _ in range(rounds):
            for name, url in targets.items():
                lat = await latencies(url, seconds)
                row = samples[name]
                row.setdefault("p50", []).append(statistics.median(lat))
                row.setdefault("p99", []).append(statistics.quantiles(lat, n=100)[98])
                row.setdefault("rps1", []).append(await throughput(url, seconds, 1))
                pid, counted = pids.get(name), list[int]()
                before = process_cpu_seconds(pid) if pid else None
                row.setdefault("rps8", []).append(await throughput(url, seconds, 8, counted))
                after = process_cpu_seconds(pid) if pid else None
                if (
                    before is not None and after is not None and counted[0]
                ):  # the process's own CPU per request
                    row.setdefault("cpu_us", []).append((after - before) / counted[0] * 1e6)
                row.setdefault("chunk", []).append(statistics.median(await first_chunk_delays(url, 50)))
        return {name: {k: statistics.median(v) for k, v in row.items()} for name, row in samples.items()}
    finally:
        stop_all(processes)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    result = asyncio.run(run(args.seconds, args.rounds))
    direct = result["direct"]
    print(f"{'target':<9}{'p50 ms':>8}{'p99 ms':>8}{'added p50':>10}{'added p99':>10}"
          f"{'req/s @1':>10}{'req/s @8':>10}{'first chunk ms':>16}{'CPU us/req @8':>15}")  # fmt: skip
    for name, row in result.items():
        cpu = f"{row['cpu_us']:>15.0f}" if "cpu_us" in row else f"{'-':>15}"
        print(
            f"{name:<9}{row['p50'] * 1e3:>8.3f}{row['p99'] * 1e3:>8.3f}{(row['p50'] - direct['p50']) * 1e3:>10.3f}"
            f"{(row['p99'] - direct['p99']) * 1e3:>10.3f}{row['rps1']:>10.0f}{row['rps8']:>10.0f}{row['chunk'] * 1e3:>16.3f}"
            + cpu
        )
    share = result["sidecar"]["rps8"] / result["bare"]["rps8"]
    share_buffered = result["sidecar"]["rps8"] / result["buffered"]["rps8"]
    print(f"sidecar throughput at 8 connections: {share:.0%} of the streaming bare proxy's, "
          f"{share_buffered:.0%} of the buffered one's")  # fmt: skip
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"proxy_overhead-{stamp}.json"
    machine = {"platform": platform.platform(), "cpus": os.cpu_count()}
    out.write_text(
        json.dumps(
            {
                "date": stamp,
                "machine": machine,
                "results": result,
                "share_of_bare": share,
                "share_of_buffered": share_buffered,
            },
            indent=2,
        )
    )
    print(f"written {out}")


if __name__ == "__main__":
    main()
