"""What one scrape costs vLLM's API process: the whole ``/metrics`` page against the light page.

Run: ``.venv/bin/python -m bench.page_cost --engine-url http://127.0.0.1:8011`` (``--pages N``, ``--rounds R``)
against a running vLLM on this machine. Alternating rounds of N sequential GETs of each page; per page, the
CPU seconds the API server process spent (``/proc/PID/stat``, the process serving ``--engine-url``'s port),
this client's CPU (httpx, as the sidecar fetches) and the wall time, medians over rounds. The light page is
the one the sidecar's asked-for rounds read (``sidecar.signals.vllm.LIGHT``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from urllib.parse import urlsplit

import httpx

from sidecar.signals.vllm import light_query
from tests.harness.admission_runs import process_cpu_seconds


def serving_pid(url: str) -> int:
    """The process listening on ``url``'s port (``ss``), i.e. vLLM's API server."""
    port = urlsplit(url).port
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=True)
    return int(out.stdout.split("pid=", 1)[1].split(",", 1)[0])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise SystemExit(f"cannot read /proc/{pid}/stat: run this on the machine vLLM runs on")
    return seconds


def main() -> None:
    """The CLI (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--pages", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base = args.engine_url.rstrip("/")
    pid = serving_pid(base)
    urls = {"full": f"{base}/metrics", "light": f"{base}/metrics/?{light_query()}"}
    figures: dict[str, dict[str, list[float]]] = {k: {"engine": [], "client": [], "wall": []} for k in urls}
    size = dict.fromkeys(urls, 0)
    with httpx.Client() as client:
        for _ in range(args.rounds):
            for kind, url in urls.items():
                engine, own, wall = cpu_seconds(pid), time.process_time(), time.perf_counter()
                for _ in range(args.pages):
                    size[kind] = len(client.get(url).content)
                figures[kind]["engine"].append((cpu_seconds(pid) - engine) / args.pages * 1e3)
                figures[kind]["client"].append((time.process_time() - own) / args.pages * 1e3)
                figures[kind]["wall"].append((time.perf_counter() - wall) / args.pages * 1e3)
    for kind, values in figures.items():
        engine, client_ms, wall = (statistics.median(values[k]) for k in ("engine", "client", "wall"))
        print(f"{kind:<6} {size[kind]:>7} B  vLLM API process {engine:5.2f} ms/page  client {client_ms:5.2f} ms"
              f"  wall {wall:5.2f} ms  (medians of {args.rounds} x {args.pages})")  # fmt: skip


if __name__ == "__main__":
    main()
