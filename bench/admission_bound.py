"""What never preempting costs on the admission suite's draws, in engine steps: the bound behind issue 11's bar.

Run: ``.venv/bin/python -m bench.admission_bound`` (``--rounds``, ``--seed``, ``--step-ms``). For each shape whose
answers have a fixed length (``ignore_eos``: long-prompt, mid-size, sustained-overload), each round replays the
suite's own draw (the same seed strings as ``bench.admission_suite``) through four schedulers of
:mod:`tests.harness.admission_bound`: vLLM 0.32's scheduler straight (it preempts), a clairvoyant admission that
never lets vLLM preempt, the sidecar's ledger told every request's progress exactly, and the *twin*
(:mod:`tests.harness.admission_twin`): the sidecar's own planner learning what the engine does as the running
sidecar does, from scrapes and returned answers, with the delays ``--transit-steps``, ``--return-steps`` and
``--scrape-steps`` (``--scrape-interval``: the periodic rounds). It prints each round's steps and the ratios
to straight (and the twin's preemptions, which must stay 0), and their medians. No engine and no network: a
round takes milliseconds (the overload's, a few seconds). The generous-max-tokens shape (answers end at stop tokens) and shared-prefix
(prefix caching) are not modelled, nor is the cost of a prefill step (so the model's engine keeps up with more
of an overload than the real one). Results go to ``bench/results/admission-bound-*.json``.

The engine's pool is the suite's: 16 blocks of 128 tokens, one of them vLLM's null block, 4 sequences. Arrivals
are placed at ``at / step_ms``; this project's CPU server runs a decode step of these shapes in about 2 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.admission.capacity import TRANSIT_SECONDS
from sidecar.admission.rates import RATE_MARGIN
from sidecar.monitor.pool import usable_blocks
from tests.harness.admission_bound import (
    Engine,
    arrivals_of,
    engine_schedule,
    ledger_schedule,
    preemption_free_schedule,
)
from tests.harness.admission_shapes import SHAPES, plan
from tests.harness.admission_twin import Knowledge, twin_schedule

RESULTS = Path(__file__).parent / "results"
FIXED_LENGTH_SHAPES = ("long-prompt", "mid-size", "sustained-overload")


def replay(
    shape: str, round_: int, seed: int, step_seconds: float, engine: Engine, overload_rate: float,
    knowledge: Knowledge,
) -> dict[str, Any]:  # fmt: skip
    """One round of ``shape``: the three schedules of its draw (the overload's at ``overload_rate``)."""
    drawn_shape = SHAPES[shape]
    if drawn_shape.seconds > 0:
        drawn_shape = dataclasses.replace(drawn_shape, rate=overload_rate)
    drawn = plan(drawn_shape, f"{seed}-{shape}-{round_}")
    arrivals = arrivals_of(drawn, step_seconds)
    start_within = math.ceil(TRANSIT_SECONDS / step_seconds * RATE_MARGIN)  # the planner's, at this rate
    straight = engine_schedule(arrivals, engine)
    clairvoyant = preemption_free_schedule(arrivals, engine)
    ledger = ledger_schedule(arrivals, engine, start_within=start_within)
    twin = twin_schedule(arrivals, engine, knowledge)
    return {
        "round": round_,
        "requests": len(arrivals),
        "straight": {"steps": straight.steps, "preemptions": straight.preemptions},
        "clairvoyant": {"steps": clairvoyant.steps, "peak_blocks": clairvoyant.peak_blocks},
        "ledger": {"steps": ledger.steps, "peak_blocks": ledger.peak_blocks},
        "twin": {"steps": twin.steps, "preemptions": twin.preemptions, "peak_blocks": twin.peak_blocks},
        "clairvoyant_ratio": clairvoyant.steps / straight.steps,
        "ledger_ratio": ledger.steps / straight.steps,
        "twin_ratio": twin.steps / straight.steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=",".join(FIXED_LENGTH_SHAPES))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7, help="the suite's --seed (its draws)")
    parser.add_argument("--step-ms", type=float, default=2.0, help="engine step time, to place arrivals")
    parser.add_argument("--overload-rate", type=float, default=40.0, help="the suite's --overload-rate")
    parser.add_argument("--num-gpu-blocks", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    lags = Knowledge()
    parser.add_argument("--transit-steps", type=int, default=lags.transit_steps, help="twin: to vLLM's queue")
    parser.add_argument("--return-steps", type=int, default=lags.return_steps, help="twin: an end back")
    parser.add_argument(
        "--scrape-steps", type=int, default=lags.scrape_steps, help="twin: a scrape's reading"
    )
    parser.add_argument("--scrape-interval", type=float, default=lags.scrape_interval)
    args = parser.parse_args()
    knowledge = Knowledge(
        args.step_ms / 1000, args.transit_steps, args.return_steps, args.scrape_steps, args.scrape_interval
    )
    shapes = [s for s in args.shapes.split(",") if s]
    if unknown := [s for s in shapes if s not in FIXED_LENGTH_SHAPES]:
        parser.error(f"not modelled: {', '.join(unknown)} (choose from {', '.join(FIXED_LENGTH_SHAPES)})")
    engine = Engine(usable_blocks(args.num_gpu_blocks), args.block_size, args.max_num_seqs)
    result: dict[str, Any] = {"args": vars(args), "shapes": {}}
    for shape in shapes:
        started = time.perf_counter()
        rounds = [
            replay(shape, r, args.seed, args.step_ms / 1000, engine, args.overload_rate, knowledge)
            for r in range(args.rounds)
        ]
        for r in rounds:
            print(
                f"{shape:<19} round {r['round'] + 1}: straight {r['straight']['steps']:>6} steps, "
                f"{r['straight']['preemptions']:>3} preemptions; clairvoyant {r['clairvoyant_ratio']:.3f}x; "
                f"ledger {r['ledger_ratio']:.3f}x; twin {r['twin_ratio']:.3f}x ({r['twin']['preemptions']} preemptions)"
            )
        medians = {
            key: statistics.median(r[key] for r in rounds)
            for key in ("clairvoyant_ratio", "ledger_ratio", "twin_ratio")
        }
        print(
            f"{shape:<19} median of {len(rounds)}: clairvoyant {medians['clairvoyant_ratio']:.3f}x, "
            f"ledger {medians['ledger_ratio']:.3f}x, twin {medians['twin_ratio']:.3f}x of straight's steps "
            f"({time.perf_counter() - started:.1f} s)"
        )
        result["shapes"][shape] = {"rounds": rounds, "medians": medians}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"admission-bound-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
