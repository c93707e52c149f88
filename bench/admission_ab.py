"""Sidecar settings side by side on one traffic shape: straight to vLLM and through each variant, same draws.

Run: ``.venv/bin/python -m bench.admission_ab --shape mid-size --rounds 4 --variant 100ms=--scrape-interval=100ms
--variant 250ms=--scrape-interval=250ms``. Every round draws one plan of the shape (sizes, kinds, arrival times)
and sends it straight to vLLM and through a fresh ``kv-sidecar run`` per variant, in an order that alternates
between rounds; before each run vLLM's prefix cache is reset, so no run rides on blocks an earlier one left
cached, and every target of a round gets the same token-id prompts and sampling seeds (fresh per round). A
variant is ``name=ARG[,ARG...]`` (sidecar arguments, ``,``-separated; ``name=`` alone is the defaults), or
``name@TREE=...`` for a sidecar run from another checkout (``git worktree add /tmp/old HEAD~1``: two versions
of the code in one run). ``--kept`` starts one sidecar per variant for the whole comparison, as in a pod (it
watches every run and keeps what it learned: the step rate, answer lengths), instead of one per run (a spike
in a sidecar's first second). ``--bare`` adds a target that goes through ``bench/bare_proxy.py`` (the
40-line streaming aiohttp pass-through, no admission): the hop's own cost on this machine, apart from what
the policy does. Prints each run and the medians (makespan, short p95, preemptions, lost, and the CPU seconds
the proxy process, sidecar or bare, used during the run; vLLM's steps and the time per step; the sidecar's scrapes
a second; the mean latency of the completed requests, steadier than a p95 of a few dozen), with each target's
paired ratio to straight; ``--overload-rate`` and ``--overload-seconds`` size the
sustained overload as the suite's options do; the engine is the
admission suite's (started here unless ``--engine-url`` is given).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.harness.admission_runs import cpu_spent, process_cpu_seconds, run_once
from tests.harness.admission_shapes import SHAPES, Planned, Shape, plan
from tests.harness.admission_suite import (
    BARE,
    STRAIGHT,
    KeptSidecar,
    Variant,
    parse_variant,
    reset_prefix_cache,
    stop_process,
    through_sidecar,
)
from tests.harness.spike import wait_idle
from tests.harness.vllm import VllmServer, free_port, make_tiny_model, vllm_python, wait_http


async def through_bare_proxy(
    engine: str, shape: Shape, planned: list[Planned], token_seed: int
) -> dict[str, Any]:
    """One run through a fresh bare streaming proxy in front of ``engine``."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.bare_proxy", str(port), engine],
        cwd=Path(__file__).parent.parent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        await wait_http(f"http://127.0.0.1:{port}/v1/models", within=30)
        before = process_cpu_seconds(process.pid)
        summary = await run_once(f"http://127.0.0.1:{port}", engine, shape, planned, token_seed)
        return summary | {"proxy_cpu_seconds": cpu_spent(process.pid, before)}
    finally:
        stop_process(process)


async def compare(
    engine: str, model: Path, shape: Shape, rounds: int, variants: dict[str, Variant], workdir: Path,
    *, bare: bool = False, kept: bool = False,
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Every round: the same draw straight, through each variant (and the bare proxy); each run's figures."""
    async with contextlib.AsyncExitStack() as stack:
        sidecars = {
            name: await stack.enter_async_context(
                KeptSidecar(engine, model, v.args, workdir / f"{name}-kept.log", v.root)
            )
            for name, v in variants.items()
            if kept
        }
        return await _compare(engine, model, shape, rounds, variants, workdir, bare, sidecars)


async def _compare(
    engine: str, model: Path, shape: Shape, rounds: int, variants: dict[str, Variant], workdir: Path,
    bare: bool, sidecars: dict[str, KeptSidecar],
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    shape_name = shape.name
    targets = [STRAIGHT, *([BARE] if bare else []), *variants]
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
    index = 0
    for round_ in range(rounds):
        planned = plan(shape, f"ab-{shape_name}-{round_}")
        for target in targets if round_ % 2 == 0 else list(reversed(targets)):
            await wait_idle(engine)
            await reset_prefix_cache(engine)
            index += 1
            if target == STRAIGHT:
                summary = await run_once(engine, engine, shape, planned, 9000 + round_)
            elif target == BARE:
                summary = await through_bare_proxy(engine, shape, planned, 9000 + round_)
            elif target in sidecars:
                summary = await sidecars[target].run(shape, planned, 9000 + round_)
            else:
                log, variant = workdir / f"{target}-{index}.log", variants[target]
                summary = await through_sidecar(
                    engine, model, variant.args, log, shape, planned, 9000 + round_, variant.root
                )
            figures = {
                k: summary.get(k)
                for k in (
                    "makespan",
                    "short_p95",
                    "preemptions",
                    "lost",
                    "proxy_cpu_seconds",
                    "engine_steps",
                    "sidecar_scrapes",
                    "mean_latency",
                )
            }
            runs[target].append(figures)
            print(
                f"  round {round_ + 1} {target:<12} " + "  ".join(f"{k} {v}" for k, v in figures.items()),
                flush=True,
            )
    return runs


def paired(runs: dict[str, list[dict[str, Any]]], target: str, key: str) -> str:
    """The median over rounds of ``target``'s ``key`` over straight's in the same round (the VM drifts between
    rounds; a round's runs share the drift)."""
    ratios = [
        t[key] / s[key]
        for t, s in zip(runs[target], runs[STRAIGHT], strict=True)
        if t[key] is not None and s[key]
    ]
    return f"{statistics.median(ratios):.2f}x" if ratios else "-"


def main() -> None:
    """The CLI (see the module docstring)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--variant", type=parse_variant, action="append", required=True)
    parser.add_argument("--bare", action="store_true", help="also run through the bare aiohttp proxy")
    parser.add_argument(
        "--kept", action="store_true", help="one sidecar per variant for all rounds, as in a pod"
    )
    parser.add_argument("--engine-url", help="a running vLLM started with the harness's settings")
    parser.add_argument(
        "--overload-seconds", type=float, help="the sustained overload's length (its default)"
    )
    parser.add_argument("--overload-rate", type=float, help="the sustained overload's arrivals a second")
    parser.add_argument(
        "--max-num-seqs", type=int, default=4, help="told to every sidecar (the harness starts 4)"
    )
    parser.add_argument("--streamed", action="store_true", help="every request of the shape streams")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    if args.streamed:
        kinds = tuple(dataclasses.replace(kind, stream_share=1.0) for kind in shape.kinds)
        shape = dataclasses.replace(shape, kinds=kinds)
    if shape.seconds > 0:
        shape = dataclasses.replace(
            shape, seconds=args.overload_seconds or shape.seconds, rate=args.overload_rate or shape.rate
        )
    workdir = Path(tempfile.mkdtemp(prefix="kv-sidecar-ab-"))
    python = vllm_python()
    model = make_tiny_model(python, workdir / "tiny-model")
    variants = {
        name: dataclasses.replace(v, args=["--max-num-seqs", str(args.max_num_seqs), *v.args])
        for name, v in args.variant
    }
    server = None
    if args.engine_url is None:
        os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")  # serves POST /reset_prefix_cache
        server = VllmServer(python, model, log_path=workdir / "vllm.log")
        server.start()
    try:
        runs = asyncio.run(compare(server.url if server else args.engine_url, model, shape, args.rounds,
                                   variants, workdir, bare=args.bare, kept=args.kept))  # fmt: skip
    finally:
        if server is not None:
            server.stop()
    print(f"\n{args.shape}, medians of {args.rounds} rounds; x: the median of each round's ratio to straight's run"
          f" (sidecar logs in {workdir})")  # fmt: skip
    for target, target_runs in runs.items():
        makespan = statistics.median(r["makespan"] for r in target_runs)
        p95 = statistics.median(r["short_p95"] for r in target_runs if r["short_p95"] is not None)
        preemptions = statistics.median(r["preemptions"] for r in target_runs)
        lost = sum(r["lost"] for r in target_runs)
        cpu = [r["proxy_cpu_seconds"] for r in target_runs if r["proxy_cpu_seconds"] is not None]
        steps = [(r["engine_steps"], r["makespan"]) for r in target_runs if r["engine_steps"]]
        per_step = statistics.median(m / n * 1000 for n, m in steps) if steps else None
        scrapes = [r["sidecar_scrapes"] / r["makespan"] for r in target_runs if r.get("sidecar_scrapes")]
        print(f"  {target:<12} makespan {makespan:6.2f} s ({paired(runs, target, 'makespan')})"
              f"  short p95 {p95:5.2f} s ({paired(runs, target, 'short_p95')})  preemptions {preemptions:g}"
              f"  lost {lost:g}  proxy CPU {f'{statistics.median(cpu):.2f} s' if cpu else '-'}"
              f"  engine steps {f'{statistics.median(n for n, _ in steps):.0f}' if steps else '-'}"
              f" ({paired(runs, target, 'engine_steps')}; {f'{per_step:.2f} ms each' if per_step else '-'})"
              + (f"  scrapes {statistics.median(scrapes):.1f}/s" if scrapes else "")
              + f"  mean latency ({paired(runs, target, 'mean_latency')})")  # fmt: skip


if __name__ == "__main__":
    main()
