"""The default admission on every spike shape of ``bench/admission_suite.py``, against the real vLLM server.

Each shape runs once straight and once through ``kv-sidecar run`` with no admission flag (told vLLM's
``--max-num-seqs``, as the chart does; one sidecar for the whole suite, as in a pod), the same prompts for
both and vLLM's prefix cache reset before each. The
headline of each shape is asserted with margins that hold on a noisy 2-core machine; the README's table holds
the medians of several rounds (``make bench-admission``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.admission_shapes import SHAPES
from tests.harness.admission_suite import run_suite
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e

NOISE = 2.5  # one run on two shared cores (vLLM busy-polls one of them): timing ratios get this much slack
SHORT_P95_SHARE = {"long-prompt": 0.85, "mid-size": 0.5}
"""The most of straight's short p95 the sidecar's may reach in one run. Issue 11's bar (0.5x) is on the medians of
the suite's rounds (the README's table). Straight, long-prompt preempts 0-2 times a round, so one round's ratio
spreads widely: 0.13-0.66x in the suite of 2026-12-05 (median 0.39x), and a CI run of that day read 0.75x
(0.48 s against 0.64 s); one run gets the margin. Mid-size's rounds spread 0.05-0.37x (median 0.07x): it needs none. Both still
fail when short requests wait behind long ones (straight's own order: 1.0x)."""


def run_once_each(
    server: VllmServer, model: Path, names: list[str], seed: int, workdir: Path
) -> dict[str, Any]:
    """Each shape of ``names`` once (the overload shortened to 20 s), direct and through one sidecar."""
    shapes = [
        dataclasses.replace(s, seconds=20.0) if s.seconds > 0 else s for s in map(SHAPES.__getitem__, names)
    ]
    return asyncio.run(
        run_suite(
            server.url, model, shapes, rounds=1, seed=seed, sidecar_args=["--max-num-seqs", "4"], progress=False,
            workdir=workdir,
        )
    )  # fmt: skip


@pytest.fixture(scope="module")
def suite(
    vllm_server: VllmServer, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Every shape once, direct and through the sidecar."""
    return run_once_each(vllm_server, tiny_model, list(SHAPES), 7, tmp_path_factory.mktemp("admission"))


Pair = tuple[dict[str, Any], dict[str, Any]]
Check = Callable[[dict[str, Any], dict[str, Any]], None]


@pytest.fixture(scope="module")
def rerun(
    vllm_server: VllmServer, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Pair]:
    """One more run of a shape, with prompts of its own (another seed), for :func:`holds_in_one_of_two`."""

    def again(name: str) -> Pair:
        workdir = tmp_path_factory.mktemp("admission-again")
        return runs(run_once_each(vllm_server, tiny_model, [name], 8, workdir), name)

    return again


def holds_in_one_of_two(
    suite: dict[str, Any], shape: str, check: Check, rerun: Callable[[str], Pair]
) -> None:
    """``check`` on the suite's run of ``shape``; where it fails, on a second run, which must pass it.

    For the timing checks one run on two shared cores cannot settle: each fresh-clone CI run of 2026-12-05 failed
    a different one on noise while every earlier session's CI had passed it. A regression (short requests behind
    long ones, the sidecar slower than straight) fails both runs; noise seldom fails two in a row.
    """
    try:
        check(*runs(suite, shape))
    except AssertionError as first:
        print(f"\n{shape}: the first run failed ({first!r}); a second run decides")
        check(*rerun(shape))


def runs(suite: dict[str, Any], shape: str) -> tuple[dict[str, Any], dict[str, Any]]:
    entry = suite["shapes"][shape]
    print(
        f"\n{shape}: direct {_brief(entry['median']['direct'])}\n{'':>{len(shape)}}  sidecar {_brief(entry['median']['sidecar'])}"
    )
    return entry["median"]["direct"], entry["median"]["sidecar"]


def _brief(run: dict[str, Any]) -> str:
    keys = ("preemptions", "short_p95", "makespan", "lost", "refused", "max_queue_depth")
    return ", ".join(f"{k}={run.get(k)}" for k in keys)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_nothing_is_lost_and_vllm_is_not_made_to_preempt(suite: dict[str, Any], shape: str) -> None:
    direct, sidecar = runs(suite, shape)
    assert sidecar["lost"] == 0, sidecar["errors"]  # (straight, vLLM itself may drop some under overload)
    assert sidecar["preemptions"] <= direct["preemptions"] // 10  # none where straight preempts fewer than 10
    assert sidecar["all_refusals_retry_after"] in {True, None}  # every refusal carries Retry-After


@pytest.mark.parametrize("shape", ["long-prompt", "mid-size"])
def test_spikes_that_make_vllm_preempt_keep_short_requests_fast(
    suite: dict[str, Any], shape: str, rerun: Callable[[str], Pair]
) -> None:
    def check(direct: dict[str, Any], sidecar: dict[str, Any]) -> None:
        if (
            shape == "mid-size"
        ):  # 7-16 preemptions straight in every run; long-prompt's 0-3 (see test_real_vllm.py)
            assert direct["preemptions"] >= 1, (
                "the straight spike did not preempt: the shape no longer tests anything"
            )
        assert sidecar["short_p95"] <= SHORT_P95_SHARE[shape] * direct["short_p95"]
        assert sidecar["makespan"] <= NOISE * direct["makespan"]
        assert sidecar["refused"] == 0  # a spike is queued, never refused

    holds_in_one_of_two(suite, shape, check, rerun)


@pytest.mark.parametrize("shape", ["generous-max-tokens", "shared-prefix"])
def test_spikes_vllm_handles_alone_are_served_whole(suite: dict[str, Any], shape: str) -> None:
    """Nothing refused, and the spike's end within the noise margin. Their p95 is not asserted on one run: the
    README's admission table holds its medians (above straight's on both: issue 11's open part)."""
    direct, sidecar = runs(suite, shape)
    assert sidecar["makespan"] <= NOISE * direct["makespan"]
    assert sidecar["refused"] == 0
    assert sidecar["completed"] == direct["completed"] == sidecar["sent"]


OVERLOADED_P95 = 2.0
"""Straight short requests with a p95 above this (seconds) waited in vLLM's queue: the arrivals outran it."""


def test_sustained_overload_keeps_the_queue_bounded_and_short_requests_flowing(
    suite: dict[str, Any], rerun: Callable[[str], Pair]
) -> None:
    """Short requests flow: at most half straight's p95 when straight fell behind, and no slower when it did not.

    The shape's 40 requests a second are about four times what this machine serves on a slow day and twice what
    it serves on a fast one (at 20, a fresh-clone CI run on 2026-12-02 saw straight's short p95 at 0.48 s and
    one on 2026-12-05 no preemption at all: no queue to protect short requests from). The README's table, from the
    60 s bench, holds the figures of an overload.
    """

    def check(direct: dict[str, Any], sidecar: dict[str, Any]) -> None:
        assert direct["preemptions"] >= 1
        if direct["short_p95"] >= OVERLOADED_P95:
            assert sidecar["short_p95"] <= 0.5 * direct["short_p95"]
        else:
            assert sidecar["short_p95"] <= NOISE * direct["short_p95"]

    holds_in_one_of_two(suite, "sustained-overload", check, rerun)
    _, sidecar = runs(suite, "sustained-overload")
    assert sidecar["max_queue_depth"] < 1024  # never at --queue-max-entries
    assert (
        sidecar["admitted_max_latency"] <= 30.0 + 15.0
    )  # the queue timeout plus a mid request's service time
    if sidecar["retried"]:
        assert sidecar["retry_admitted_share"] >= 0.5  # clients that waited the advised time got in
