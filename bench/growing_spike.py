"""A tight spike of growing requests, straight to a running vLLM and through sidecars of one or more checkouts.

Run: ``.venv/bin/python -m bench.growing_spike --engine-url http://127.0.0.1:8012 --model /tmp/kv/tiny --rounds 4
--variant new=. --variant old=/tmp/kv/old``. Each round sends six 300 + 600 requests and four short ones within
0.1 s (the spike of ``tests/e2e/test_speculative_engine.py``, a fresh seed each round) straight to the engine and
then through a ``kv-sidecar run`` of each checkout (started once per variant and kept, as in a pod; ``git worktree
add /tmp/kv/old HEAD~1`` gives an older one), resetting vLLM's prefix cache before each run. The engine must have
the harness's settings (16 blocks of 128 tokens, 4 sequences); with ``--speculative-config`` it is where
speculative decoding's cost shows (``README.md``, "Speculative decoding"). Prints each run and the median ratio of
each variant's time to straight's, with the preemptions.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.harness.spike import SpikeConfig, run_spike, wait_idle


def _sidecar(tree: Path, engine: str, model: Path, port: int) -> subprocess.Popen[bytes]:
    """``kv-sidecar run`` from ``tree`` with the spike harness's flags, ready when its admin port answers."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "run", "--upstream", engine, "--listen", f"127.0.0.1:{port}",
         "--admin-listen", f"127.0.0.1:{port + 1}", "--model", str(model), "--gpu-memory", "24GiB", "--nvml",
         "off", "--max-num-seqs", "4", "--log-level", "warning"],
        cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(150):
        try:
            httpx.get(f"http://127.0.0.1:{port + 1}/status", timeout=1.0)
            return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.terminate()
    raise SystemExit(f"the sidecar from {tree} did not start")


async def _compare(args: argparse.Namespace, variants: dict[str, str]) -> None:
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    await asyncio.sleep(2.0)  # a few scrapes: the pool and the step rate
    async with httpx.AsyncClient(timeout=10.0) as client:
        for round_ in range(args.rounds):
            config = SpikeConfig(
                seed=5 + round_, long_requests=6, short_requests=4, long_prompt=300, long_output=600,
                spread_seconds=0.1,
            )  # fmt: skip
            seconds = {}
            for name, target in {"straight": args.engine_url, **variants}.items():
                await wait_idle(args.engine_url)
                await client.post(args.engine_url + "/reset_prefix_cache")
                report = await run_spike(target, args.engine_url, config, f"{name}-{round_}")
                seconds[name] = report.seconds
                print(
                    f"round {round_ + 1} {name:10} {report.seconds:.2f} s  preemptions {report.preemptions:.0f}"
                )
            for name in variants:
                ratios[name].append(seconds[name] / seconds["straight"])
    for name, values in ratios.items():
        print(f"{name}: median {statistics.median(values):.2f}x straight's time over {len(values)} rounds")


def main() -> None:
    """Parse the flags and run the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine-url", required=True, help="a running vLLM with the harness's settings")
    parser.add_argument("--model", type=Path, required=True, help="the engine's model directory")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--variant", action="append", required=True, help="name=checkout directory")
    args = parser.parse_args()
    trees = dict(variant.split("=", 1) for variant in args.variant)
    sidecars = [
        _sidecar(Path(tree).resolve(), args.engine_url, args.model, 8790 + 2 * i)
        for i, tree in enumerate(trees.values())
    ]
    try:
        asyncio.run(
            _compare(args, {name: f"http://127.0.0.1:{8790 + 2 * i}" for i, name in enumerate(trees)})
        )
    finally:
        for process in sidecars:
            process.terminate()


if __name__ == "__main__":
    main()
