"""The admission suite: five traffic shapes (:mod:`tests.harness.admission_shapes`), each straight to vLLM and through ``kv-sidecar run``.

Run: ``.venv/bin/python -m bench.admission_suite`` (``make bench-admission``). It starts one vLLM CPU
server with the harness defaults (16 blocks x 128 tokens = 2,048-token pool, 4 sequences, max_model_len
1024; ``VLLM_SERVER_DEV_MODE=1`` so ``POST /reset_prefix_cache`` exists) unless ``--engine-url`` is given.
For every shape and round it sends the same traffic twice, direct and through the sidecar (no admission flags:
add some with ``--sidecar-arg=--admission --sidecar-arg=lanes``), alternating which goes first per round.
The sidecar is started once for the suite and watches every run, straight ones included, as it watches vLLM
in a pod (:class:`KeptSidecar`); ``--fresh-sidecar`` starts one for each run instead, so every spike meets a
sidecar that has just started (no step rate, no answers of its own: the harder case). Before each run it waits for vLLM to be idle and resets its prefix cache, so no
run rides on blocks an earlier one left cached (the summary says if a reset failed). Both targets of a round get
the same traffic: sizes, kinds, arrival times, token-id prompts and sampling seeds (seed ``base*1000 + round``),
fresh per round; with random weights the answers' lengths depend on the prompt and seed, so drawing them per
run compared different work (the generous-max-tokens shape's answers differed by up to 25% at p90 between the
two targets of one round).


Each run is :func:`tests.harness.admission_runs.run_once`; the figures across rounds are
:mod:`tests.harness.admission_report`'s. The machine's two cores are shared with vLLM's busy-polling engine:
compare the columns of one run, not absolute times. Raw results go to ``bench/results/admission-*.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import aiohttp

from tests.harness.admission_report import medians, paired_ratios, print_shape, print_summary
from tests.harness.admission_runs import cpu_spent, process_cpu_seconds, run_once
from tests.harness.admission_shapes import SHAPES, Planned, Shape, plan
from tests.harness.spike import RESULTS, wait_idle
from tests.harness.vllm import ROOT, VllmServer, free_port, make_tiny_model, vllm_python

STRAIGHT = "straight"
"""The A/B bench's name for runs straight to vLLM."""
BARE = "bare"
"""The A/B bench's name for runs through the bare pass-through."""


@dataclass(frozen=True)
class Variant:
    """A sidecar to compare: its arguments and the checkout it runs from."""

    args: list[str]
    root: Path = ROOT


def parse_variant(text: str) -> tuple[str, Variant]:
    """``name[@TREE]=ARG,ARG`` -> (name, variant): the A/B bench's ``--variant``."""
    label, _, args = text.partition("=")
    name, _, tree = label.partition("@")
    if not name or name in {STRAIGHT, BARE}:
        raise argparse.ArgumentTypeError(
            f"a variant needs a name other than {STRAIGHT!r} or {BARE!r}: {text!r}"
        )
    root = Path(tree).resolve() if tree else ROOT
    if not (root / "sidecar").is_dir():
        raise argparse.ArgumentTypeError(f"{root} is not a kv-sidecar checkout (no sidecar/ in it): {text!r}")
    return name, Variant([a for a in args.split(",") if a], root)


def start_sidecar(
    engine: str, model: Path, extra: list[str], log: IO[bytes], root: Path = ROOT
) -> tuple[subprocess.Popen[bytes], str, str]:
    """A fresh ``kv-sidecar run`` (no admission flags but ``extra``) from the checkout at ``root``; the process,
    proxy and admin URLs."""
    port, admin = free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "run", "--upstream", engine, "--listen", f"127.0.0.1:{port}",
         "--admin-listen", f"127.0.0.1:{admin}", "--model", str(model), "--gpu-memory", "24GiB", "--nvml", "off",
         "--log-level", "warning", *extra],
        cwd=root, stdout=log, stderr=subprocess.STDOUT,
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
    engine: str, model: Path, extra: list[str], log_path: Path, shape: Shape, planned: list[Planned], token_seed: int,
    root: Path = ROOT,
) -> dict[str, Any]:  # fmt: skip
    """One run through a sidecar started for it alone (stopped after; its log in ``log_path``)."""
    with log_path.open("wb") as log:
        process, proxy, admin = start_sidecar(engine, model, extra, log, root)
        try:
            status = await wait_sidecar(process, admin)
            cpu_before = process_cpu_seconds(process.pid)
            summary = await run_once(proxy, engine, shape, planned, token_seed, admin)
            summary["proxy_cpu_seconds"] = cpu_spent(process.pid, cpu_before)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; sidecar log: {tail(log_path)}") from exc
        finally:
            stop_process(process)
    return summary | {"sidecar_admission_at_start": status.get("admission"), "sidecar_log": tail(log_path)}


class KeptSidecar:
    """One ``kv-sidecar run`` for the whole suite, as in a pod: started once, it watches every run, straight
    ones included, so a spike meets a sidecar that knows the engine's step rate and its answers' lengths."""

    def __init__(self, engine: str, model: Path, extra: list[str], log_path: Path, root: Path = ROOT) -> None:
        self.engine, self.model, self.extra, self.log_path, self.root = engine, model, extra, log_path, root
        self._log: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.proxy = self.admin = ""

    async def __aenter__(self) -> KeptSidecar:
        self._log = self.log_path.open("wb")
        self.process, self.proxy, self.admin = start_sidecar(
            self.engine, self.model, self.extra, self._log, self.root
        )
        try:
            await wait_sidecar(self.process, self.admin)
        except RuntimeError as exc:
            await self.__aexit__()
            raise RuntimeError(f"{exc}; sidecar log: {tail(self.log_path)}") from exc
        return self

    async def __aexit__(self, *_: object) -> None:
        if self.process is not None:
            stop_process(self.process)
        if self._log is not None:
            self._log.close()

    async def run(self, shape: Shape, planned: list[Planned], token_seed: int) -> dict[str, Any]:
        """One run through the kept sidecar, with the CPU its process used during the run."""
        assert self.process is not None, "use KeptSidecar as an async context manager"
        async with aiohttp.ClientSession() as session, session.get(self.admin + "/status") as response:
            status: dict[str, Any] = await response.json()
        cpu_before = process_cpu_seconds(self.process.pid)
        try:
            summary = await run_once(self.proxy, self.engine, shape, planned, token_seed, self.admin)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; sidecar log: {tail(self.log_path)}") from exc
        if self.process.poll() is not None:
            raise RuntimeError(f"the kept sidecar exited ({self.process.returncode}): {tail(self.log_path)}")
        return summary | {
            "proxy_cpu_seconds": cpu_spent(self.process.pid, cpu_before),
            "sidecar_admission_at_start": status.get("admission"),
        }


async def run_suite(
    engine_url: str, model: Path, shapes: list[Shape], rounds: int, sidecar_args: list[str],
    seed: int = 7, progress: bool = True, workdir: Path | None = None, fresh_sidecars: bool = False,
    overload_rounds: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Every shape ``rounds`` times (an open-loop one ``overload_rounds`` when given), direct and through the
    sidecar; raw runs and medians.

    The sidecar is one :class:`KeptSidecar` for the suite, or with ``fresh_sidecars`` one started for each run
    (a spike right after the sidecar starts: no step rate, no answers of its own yet)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="kv-sidecar-admission-"))
    async with contextlib.AsyncExitStack() as stack:
        kept = None
        if not fresh_sidecars:
            kept = await stack.enter_async_context(
                KeptSidecar(engine_url, model, sidecar_args, workdir / "sidecar-kept.log")
            )
        return await _run_shapes(
            engine_url, model, shapes, (rounds, overload_rounds or rounds), sidecar_args, seed, progress,
            workdir, kept,
        )  # fmt: skip


async def _run_shapes(
    engine_url: str, model: Path, shapes: list[Shape], rounds: tuple[int, int], sidecar_args: list[str], seed: int,
    progress: bool, workdir: Path, kept: KeptSidecar | None,
) -> dict[str, Any]:  # fmt: skip
    """``rounds``: of each burst shape, of each open-loop one."""
    result: dict[str, Any] = {"engine_url": engine_url, "sidecar_args": sidecar_args, "seed": seed,
                              "rounds": rounds[0], "overload_rounds": rounds[1],
                              "prefix_cache_reset": True, "sidecar": "fresh per run" if kept is None else "kept",
                              "shapes": {}}  # fmt: skip
    run_index = 0
    if progress:
        print(f"  sidecar logs in {workdir}", flush=True)
    for shape in shapes:
        runs: dict[str, list[dict[str, Any]]] = {"direct": [], "sidecar": []}
        shape_rounds = rounds[1] if shape.seconds > 0 else rounds[0]
        for round_ in range(shape_rounds):
            planned = plan(shape, f"{seed}-{shape.name}-{round_}")
            for target in ("direct", "sidecar") if round_ % 2 == 0 else ("sidecar", "direct"):
                await wait_idle(engine_url)
                result["prefix_cache_reset"] &= await reset_prefix_cache(engine_url)
                run_index += 1
                token_seed = seed * 1000 + round_  # the same prompts and sampling seeds for both targets
                if progress:
                    print(
                        f"  {shape.name} round {round_ + 1}/{shape_rounds} {target} ({len(planned)} requests)",
                        flush=True,
                    )
                if target == "direct":
                    summary = await run_once(engine_url, engine_url, shape, planned, token_seed)
                elif kept is not None:
                    summary = await kept.run(shape, planned, token_seed)
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


def main() -> None:
    # fmt: off
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of: " + ", ".join(SHAPES))
    parser.add_argument("--rounds", type=int, default=1, help="repeat each shape (medians reported)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--overload-rounds", type=int,
                        help="rounds of the sustained overload (default: --rounds); each takes twice its length")
    parser.add_argument("--overload-seconds", type=float, default=60.0)
    parser.add_argument("--overload-rate", type=float, default=SHAPES["sustained-overload"].rate,
                        help="arrivals per second of the sustained overload (default %(default)s)")
    parser.add_argument("--engine-url", help="use a running vLLM (started with the harness's settings)")
    parser.add_argument("--sidecar-arg", action="append", default=[], help="extra `kv-sidecar run` argument (repeatable)")
    parser.add_argument("--max-num-seqs", type=int, default=4,
                        help="vLLM's --max-num-seqs, told to the sidecar as the Helm chart does (the harness starts 4)")
    parser.add_argument("--fresh-sidecar", action="store_true",
                        help="start a sidecar for each run (a spike right after start) instead of one for the suite")
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
                      progress=not args.quiet, workdir=workdir, fresh_sidecars=args.fresh_sidecar,
                      overload_rounds=args.overload_rounds)
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
