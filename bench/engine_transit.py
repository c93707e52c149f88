"""How long a request takes to reach vLLM's scheduler and start: the evidence for ``TRANSIT_SECONDS``.

Run against a running vLLM (the admission suite's engine, ``max_num_seqs`` 4):
``.venv/bin/python -m bench.engine_transit --engine-url http://127.0.0.1:8011 --background 3 --probes 400``
(``--busy`` adds a process that keeps one core busy, as the sidecar and a load generator would).

``--background`` requests (300-450-token prompts, 300 tokens out) keep the engine stepping, fewer than its
sequence limit so a slot is always free; meanwhile probes go one at a time, 10-50 ms apart: a streamed
8-token prompt with ``max_tokens`` 2, timed from the send to its first byte back. That round trip holds the
transit (HTTP, the API server, the hand-off to the engine core), the wait for the step in progress, the
probe's own prefill step and the way back, so it bounds the transit from above. Prints p50, p90, p99 and the
most, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import time

import httpx


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def _background(client: httpx.AsyncClient, url: str, model: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        prompt = [random.randint(100, 30000) for _ in range(random.randint(300, 450))]
        body = {"model": model, "prompt": prompt, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
        await client.post(url, json=body, timeout=120)


async def _probe(client: httpx.AsyncClient, url: str, model: str) -> float:
    body = {
        "model": model, "prompt": [random.randint(100, 30000) for _ in range(8)], "max_tokens": 2,
        "ignore_eos": True, "temperature": 0, "stream": True,
    }  # fmt: skip
    started = time.perf_counter()
    async with client.stream("POST", url, json=body, timeout=60) as response:
        chunks = response.aiter_raw()
        await chunks.__anext__()
        first = time.perf_counter() - started
        async for _ in chunks:
            pass
    return first


async def measure(engine_url: str, model: str, background: int, probes: int) -> list[float]:
    """Probe round trips (seconds) while ``background`` long answers run."""
    url = f"{engine_url.rstrip('/')}/v1/completions"
    stop, times = asyncio.Event(), list[float]()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=background + 4)) as client:
        tasks = [asyncio.create_task(_background(client, url, model, stop)) for _ in range(background)]
        await asyncio.sleep(1.0)
        for _ in range(probes):
            times.append(await _probe(client, url, model))
            await asyncio.sleep(random.uniform(0.01, 0.05))
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return sorted(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--model", default="tiny", help="the served model name")
    parser.add_argument("--background", type=int, default=3, help="long answers running meanwhile")
    parser.add_argument("--probes", type=int, default=400)
    parser.add_argument("--busy", action="store_true", help="keep one core busy in another process")
    args = parser.parse_args()
    hog = None
    if args.busy:
        hog = multiprocessing.Process(target=_busy, args=(3600.0,), daemon=True)
        hog.start()
    try:
        times = asyncio.run(measure(args.engine_url, args.model, args.background, args.probes))
    finally:
        if hog is not None:
            hog.terminate()

    def quantile(q: float) -> float:
        return times[min(len(times) - 1, int(q * len(times)))] * 1000

    print(
        f"background {args.background}, busy core {args.busy}, {len(times)} probes: p50 {quantile(0.5):.1f} ms, "
        f"p90 {quantile(0.9):.1f}, p99 {quantile(0.99):.1f}, most {times[-1] * 1000:.1f}"
    )


if __name__ == "__main__":
    main()
