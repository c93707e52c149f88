"""The prediction against real vLLM start-up logs: per-row error of the KV pool and of the maximum concurrency.

``tests/data/vllm-startup-logs/calibration.json`` holds real logs from public sources (provenance in its
README). Each row whose inputs are known is planned with exactly the settings the log states (release, GPU
memory, TP, ``max_model_len``, dtypes, utilisation, batch flags, eager) and compared with what that vLLM
printed: "KV cache size: N tokens" and "Maximum concurrency for L tokens per request". The summary is printed
(``pytest -s``) and bounded, so a change that makes predictions worse fails here; README states the figures.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import Ledger, PlanRequest, architecture_from_config, build_ledger
from sidecar.budget.model_runner import ModelRunner
from sidecar.budget.vllm_release import PINNED_SEGMENTS_OBSERVED_BYTES, VllmRelease
from sidecar.units import GIB

DATA = Path(__file__).parents[1] / "data"
ROWS: list[dict[str, Any]] = json.loads((DATA / "vllm-startup-logs" / "calibration.json").read_text())
BOUNDS = {"median": 0.002, "p90": 0.03, "worst": 0.50}
"""Today's figures, rounded up: a change that makes predictions worse fails. On 53 rows the pool's median is
0.11%, p90 2.9%, worst 49.6%, mean 3.2% (README, "Calibration against real start-up logs"). The targets (3%,
10%, 20%) are met for the median and the p90. Four rows are beyond 10%: gpt-oss-20b boots at TP 1 on an L4
(vLLM 0.29; two of them the same settings, so the miss repeats) and a vLLM 0.30 boot that compiled cold (its
eager twin: -0.6%); issue 12 stays open for them. The p90 was 2.5% on 51 rows before those two V2-runner boots
joined. The p90 was 15%
on 33 rows before Llama 4 was read as transformers builds it, the RoPE table counted in the weights (Scout
+35.9% -> +1.8%) and ten more rows of the llm-d sweep joined, 8.5% before the TP non-torch figure was limited to
Hopper and Blackwell GPUs (the L4 TP 2 row -20.8% -> -2.2%), and 5.2% on 46 rows before the sampler pass that
sorts the vocabulary (vLLM 0.11.1-0.16, and earlier without FlashInfer) was modelled: the RTX 2000 Ada row
went from +14.8% to -2.5%, the A100 boot that fell back to PyTorch's sampler from +8.5% to +0.6%, and
Qwen3-14B on 0.15/0.16 lands within 0.4% (+7.9% without the rule)."""


def excluded(row: dict[str, Any]) -> str | None:
    """Why a row cannot be planned from what its log states, or ``None``."""
    if not row.get("config"):
        return "the model's config.json is not in the corpus"
    if not row.get("kv_cache_tokens") or not row.get("gpu_memory_gib"):
        return "the log lacks the KV size or the GPU memory"
    if not row.get("max_model_len"):
        return "the log lacks max_model_len"
    return None


@dataclass(frozen=True)
class Prediction:
    """One row's prediction next to the log."""

    id: str
    tokens: int
    logged_tokens: int
    concurrency: float
    logged_concurrency: float | None

    @property
    def error(self) -> float:
        """Signed relative error of the KV pool in tokens."""
        return (self.tokens - self.logged_tokens) / self.logged_tokens


def plan(row: dict[str, Any]) -> Ledger:
    """The ledger of ``row``, planned with the settings its log states."""
    arch = architecture_from_config(json.loads((DATA / "hf-configs" / row["config"]).read_text()))
    release = VllmRelease.parse(row["vllm_version"] or "0.32.0")
    weight = (
        "fp32" if row.get("dtype") == "float32" else ("fp8" if row.get("quantization") == "fp8" else None)
    )
    request = PlanRequest(
        arch, round(row["gpu_memory_gib"] * GIB), gpu=row.get("gpu") or "custom",
        max_model_len=row["max_model_len"], tensor_parallel_size=row.get("tensor_parallel_size") or 1,
        pipeline_parallel_size=row.get("pipeline_parallel_size") or 1,
        data_parallel_size=row.get("data_parallel_size") or 1,
        enable_expert_parallel=bool(row.get("enable_expert_parallel")),
        kv_cache_dtype=row.get("kv_cache_dtype") or "auto", weight_dtype=weight,
        gpu_memory_utilization=row.get("gpu_memory_utilization"), vllm_version=str(release),
        enforce_eager=bool(row.get("enforce_eager")), max_num_batched_tokens=row.get("max_num_batched_tokens"),
        max_num_seqs=row.get("max_num_seqs"), block_size=row.get("block_size") or 16,
        async_scheduling=row.get("async_scheduling", True), flashinfer_sampler=row.get("flashinfer_sampler"),
        model_runner=ModelRunner(row["model_runner"]) if row.get("model_runner") else None,
    )  # fmt: skip
    return build_ledger(request)


def predict(row: dict[str, Any]) -> Prediction:
    """Plan ``row`` and compare the pool and concurrency with what its log printed."""
    ledger = plan(row)
    return Prediction(
        row["id"],
        ledger.kv_pool_tokens,  # as vLLM logs it (the release's rule)
        row["kv_cache_tokens"],
        ledger.max_concurrency,
        row.get("max_concurrency"),
    )


PLANNED = [r for r in ROWS if excluded(r) is None]


def test_the_table_is_large_enough_and_says_why_rows_are_left_out() -> None:
    assert len(ROWS) >= 25
    assert len(PLANNED) >= 25
    assert all(excluded(r) for r in ROWS if r not in PLANNED)


def test_pool_and_concurrency_errors_are_bounded() -> None:
    predictions = [predict(r) for r in PLANNED]
    errors = sorted(abs(p.error) for p in predictions)
    concurrency = sorted(
        abs(p.concurrency - p.logged_concurrency) / p.logged_concurrency
        for p in predictions
        if p.logged_concurrency
    )
    summary = {}
    for name, values in (("pool", errors), ("concurrency", concurrency)):
        summary[name] = {
            "rows": len(values),
            "median": statistics.median(values),
            "p90": values[max(0, round(0.9 * len(values)) - 1)],
            "worst": values[-1],
        }
    for p in predictions:
        print(f"{p.id:<44} predicted {p.tokens:>10,}  logged {p.logged_tokens:>10,}  {p.error:+.1%}")
    print(json.dumps(summary, indent=1))
    for name in ("pool", "concurrency"):
        for statistic, bound in BOUNDS.items():
            assert summary[name][statistic] <= bound, (name, statistic, summary[name])


@pytest.mark.parametrize("row", PLANNED, ids=[r["id"] for r in PLANNED])
def test_every_planned_row_predicts_a_pool(row: dict[str, Any]) -> None:
    assert predict(row).tokens > 0


TERMS = {
    # (profile term, the row field holding what the log printed, bound on |predicted - logged| in GiB)
    "weights": ("weights_gib", 0.12),
    "activation": ("torch_peak_increase_gib", 0.10),
    "non_torch": ("non_torch_gib", 0.25),
}
"""Each profile term against the log line that prints it ("Model loading took", "torch peak memory
increase", "non-torch forward increase memory"), so a term that drifts fails here even when the pool
still comes out right because another term drifted the other way (as activation and non-torch did)."""


STAGE_ONE_ACTIVATION_BOUND = {"activation": 0.15}
"""The one exception: a pipeline row prints stage 1's profile, whose forward-only peak (1.10 GiB on both llm-d
rows) is 0.14 GiB above this model's forward pass. Probably the stage's output, hidden states and residual of
the whole batch (2 x 8192 x 4096 x 2 bytes = 0.125 GiB), which a stage before the last returns instead of
sampling (``IntermediateTensors`` in ``llama.py``); not modelled, as the last stage sets the pool (within 0.1%)."""


def _row_term(row: dict[str, Any], term: str, ledger: Ledger) -> tuple[float, float]:
    """The term as predicted for ``row`` (GiB) and the bound it is held to."""
    predicted = printed_profile(ledger)[term] / GIB
    bound = TERMS[term][1]
    if ledger.stages:
        bound = STAGE_ONE_ACTIVATION_BOUND.get(term, bound)
    return predicted, bound


def printed_profile(ledger: Ledger) -> dict[str, int]:
    """The profile of the worker whose lines a log prints: with pipeline parallelism, the first stage's."""
    if not ledger.stages:
        return ledger.profile
    first = ledger.stages[0]
    return {**ledger.profile, "weights": first.weights, "activation": first.activation}


@pytest.mark.parametrize("term", sorted(TERMS))
def test_each_profile_term_matches_the_log_line_that_prints_it(term: str) -> None:
    field, _ = TERMS[term]
    misses = []
    rows = [r for r in PLANNED if r.get(field) is not None]
    for row in rows:
        predicted, allowed = _row_term(row, term, plan(row))
        if abs(predicted - row[field]) > allowed:
            misses.append(f"{row['id']}: predicted {predicted:.2f} GiB, logged {row[field]:.2f}")
    assert len(rows) >= 5, f"too few rows print {field}"
    assert not misses, misses


def test_the_pinned_segment_range_covers_every_affected_boot_on_the_table() -> None:
    # vLLM 0.27-0.30 charge segments pinned in the profile to the pool (vllm_release.py): the range a plan
    # warns of must hold every such boot's non-KV memory beyond the plan, and each such plan must warn
    low, high = PINNED_SEGMENTS_OBSERVED_BYTES
    affected = []
    for row in PLANNED:
        ledger = plan(row)
        beyond = ledger.kv_pool_bytes * (1 - row["kv_cache_tokens"] / ledger.kv_pool_tokens)
        if ledger.request.release.counts_pinned_profile_segments():
            affected.append(row["id"])
            assert low <= beyond <= high, (row["id"], beyond / GIB)
            assert any("freed during its start-up profile" in note for note in ledger.notes)
    assert len(affected) >= 5
