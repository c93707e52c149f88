"""The admission core's own cost per request: ``admit`` then ``release``, no HTTP, no engine.

Run: ``.venv/bin/python -m bench.admission_path [--requests 20000] [--inflight 8] [--rounds 5]``.

The proxy's throughput on a fast upstream (``bench.proxy_overhead``) moves by 10% between runs on a
2-core VM, too much to see a change of a few microseconds in the admission path. This runs the path
alone: a capacity controller with a large pool (nothing waits), ``--inflight`` requests held, and each
iteration admits one request and releases the oldest (its answer length learned). It prints the
median microseconds per iteration over ``--rounds`` rounds (and the fastest), on one core.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from prometheus_client import CollectorRegistry

from sidecar.admission.body import RequestFacts
from sidecar.admission.controller import AdmissionController, QueueSettings
from sidecar.admission.decide import AdmissionConfig
from sidecar.admission.geometry import PoolView
from sidecar.admission.pressure import PressureDetector, PressureSettings, StaleMode, Staleness
from sidecar.server.metrics import AdmissionMetrics

POOL = PoolView(blocks=65536, block_size=16)  # a 1M-token pool: every request fits at once
FACTS = RequestFacts(
    prompts=(12,),
    max_output_tokens=16,
    exact=False,
    route="/v1/completions",
    model="m",
    tenant="t",
    wait_limit=30.0,
)


async def one_round(requests: int, inflight: int) -> float:
    """Microseconds per admit + release over ``requests`` iterations."""
    now = [100.0]
    controller = AdmissionController(
        AdmissionConfig(), PressureDetector(PressureSettings()), QueueSettings(),
        AdmissionMetrics(CollectorRegistry()), clock=lambda: now[0], max_model_len=lambda: 32768,
        pool=lambda: POOL, metrics_age=lambda _: 0.1, staleness=Staleness(after=3.0, policy=StaleMode.OPEN),
    )  # fmt: skip
    controller.observe(now[0], 0.1, stale=False, steps=1000, waiting=0, running=0, sampled_at=now[0])
    held = [await controller.admit(FACTS) for _ in range(inflight)]
    started = time.perf_counter()
    for _ in range(requests):
        now[0] += 0.0001
        ticket = await controller.admit(FACTS)
        oldest = held.pop(0)
        oldest.completion_tokens = 8
        controller.release(oldest)
        held.append(ticket)
    return (time.perf_counter() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--inflight", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times = [asyncio.run(one_round(args.requests, args.inflight)) for _ in range(args.rounds)]
    print(f"admit + release: median {statistics.median(times):.1f} us, fastest {min(times):.1f} us "
          f"({args.rounds} rounds of {args.requests}, {args.inflight} in flight)")  # fmt: skip


if __name__ == "__main__":
    main()
