"""How many pool blocks one request really holds at its peak: vLLM's KV usage polled while it runs.

For hybrid models with state layers the question is whether a running request holds more state pages than
vLLM's own ``kv_cache_max_concurrency`` counts (the figure capacity admission plans with). Run against a
vLLM serving the model with a small pool, for example the e2e tier's wide Qwen3-Next with a 4K context
(``tests/e2e/state_probe.py make``, ``max_position_embeddings`` raised to 4096 in its config)::

    vllm serve MODEL --max-model-len 4096 --num-gpu-blocks-override 64 --mamba-ssm-cache-dtype bfloat16 \\
        --max-num-batched-tokens 1024 --port 8020
    .venv/bin/python -m bench.kv_peak --engine-url http://127.0.0.1:8020 --model MODEL \\
        --prompt-tokens 3000 --output-tokens 500 --runs 2

Each run sends one request of fresh random token ids (``ignore_eos``, so it runs to ``--output-tokens``)
and polls ``/metrics`` every ``--poll-ms``; it prints the peak ``kv_cache_usage_perc`` and that peak in
blocks of the engine's pool (``num_gpu_blocks`` less vLLM's null block), beside the engine's own blocks per
full-length request (``num_gpu_blocks / kv_cache_max_concurrency``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random

import httpx

from sidecar.signals import parse_vllm_metrics


async def _peak(client: httpx.AsyncClient, url: str, stop: asyncio.Event, poll: float) -> float:
    peak = 0.0
    while not stop.is_set():
        snapshot = parse_vllm_metrics((await client.get(url + "/metrics")).text)
        peak = max(peak, snapshot.kv_usage or 0.0)
        await asyncio.sleep(poll)
    return peak


async def _run(args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        config = parse_vllm_metrics((await client.get(args.engine_url + "/metrics")).text).cache_config
        if config is None or not config.num_gpu_blocks:
            raise SystemExit("the engine's page has no cache_config_info with num_gpu_blocks")
        usable = config.num_gpu_blocks - 1
        per_request = config.num_gpu_blocks / (config.kv_cache_max_concurrency or 1)
        for run in range(args.runs):
            stop = asyncio.Event()
            poller = asyncio.create_task(_peak(client, args.engine_url, stop, args.poll_ms / 1000))
            body = {
                "model": args.model,
                "prompt": [random.randint(100, 400) for _ in range(args.prompt_tokens)],
                "max_tokens": args.output_tokens,
                "ignore_eos": True,
                "temperature": 0,
            }
            await client.post(args.engine_url + "/v1/completions", json=body)
            stop.set()
            peak = await poller
            print(json.dumps({
                "run": run, "peak_usage": round(peak, 4), "peak_blocks": round(peak * usable, 1),
                "usable_blocks": usable, "engine_blocks_per_full_request": round(per_request, 2),
                "block_size": config.block_size,
            }))  # fmt: skip


def main() -> None:
    """Parse the flags and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--model", required=True, help="the served model's name")
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--output-tokens", type=int, default=500)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--poll-ms", type=float, default=20)
    asyncio.run(_run(parser.parse_args()))


if __name__ == "__main__":
    main()
