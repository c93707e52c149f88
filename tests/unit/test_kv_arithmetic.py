"""The KV arithmetic alone against real logs: from the memory a boot printed for KV to the tokens it printed.

A start-up log prints "Available KV cache memory: X GiB" and then "GPU KV cache size: N tokens". Planning that
boot with X as the pool (``kv_cache_memory_bytes``) and comparing with N checks everything between the two
lines (bytes per token, block size and alignment, KV cache groups, state pages, blocks per request, how the
release reports tokens) apart from the memory profile, which ``test_calibration.py`` checks. Two sources:

* every planned row of ``calibration.json`` that prints the available memory, but for pipeline-parallel rows
  (their log prints one stage's memory; the pool is the smallest stage's, planned per stage);
* ``kv-arithmetic.json``: boots whose memory profile is not plannable from the log (NVFP4 weights, a vision
  profile) but whose KV arithmetic is, such as a hybrid DeltaNet model on an RTX 5090 (vLLM 0.24.0, two
  boots): its 2,096-token blocks, four KV cache groups and two blocks per DeltaNet group with prefix caching
  give the 567,978 and 569,878 tokens and 4.33x and 4.35x it logged; and Gemma 4 26B-A4B on an L40S (vLLM
  0.29.0, five boots; the table lacks the checkpoint's own config.json): full-attention pages of another size
  than the sliding ones, unified as 0.29 does, at 16-, 48- and 128-token blocks and with FP8 KV.

The bound is the log's own rounding: X has two decimals (half of 0.01 GiB of X), and a block more or less.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import Ledger, PlanRequest, architecture_from_config, build_ledger
from sidecar.units import GIB
from tests.unit.test_calibration import PLANNED, plan

DATA = Path(__file__).parents[1] / "data" / "vllm-startup-logs"
EXTRA: list[dict[str, Any]] = json.loads((DATA / "kv-arithmetic.json").read_text())
ROUNDING_GIB = 0.005  # "X.XX GiB": the printed figure is within half a hundredth of the real one
CALIBRATION_ROWS = [
    row for row in PLANNED if row.get("available_kv_gib") and (row.get("pipeline_parallel_size") or 1) == 1
]


def _with_available_memory(ledger: Ledger, available_gib: float) -> Ledger:
    return build_ledger(dataclasses.replace(ledger.request, kv_cache_memory_bytes=round(available_gib * GIB)))


def _extra_ledger(row: dict[str, Any]) -> Ledger:
    request = PlanRequest(
        architecture_from_config(row["config"]), 64 * GIB, max_model_len=row["max_model_len"],
        tensor_parallel_size=row["tensor_parallel_size"], kv_cache_dtype=row["kv_cache_dtype"],
        block_size=row["block_size"], enable_prefix_caching=row["enable_prefix_caching"],
        vllm_version=row["vllm_version"], kv_cache_memory_bytes=round(row["available_kv_gib"] * GIB),
        max_num_batched_tokens=row.get("max_num_batched_tokens"), max_num_seqs=row.get("max_num_seqs"),
        async_scheduling=row.get("async_scheduling", True),
    )  # fmt: skip  # the GPU's size plays no part once the pool is given
    return build_ledger(request)


def _bound(ledger: Ledger, available_gib: float) -> float:
    """The relative gap the log's rounding allows: the memory's last digit and one block."""
    return ROUNDING_GIB / available_gib + 1 / ledger.kv_pool_blocks


@pytest.mark.parametrize("row", CALIBRATION_ROWS, ids=[r["id"] for r in CALIBRATION_ROWS])
def test_the_logged_kv_memory_gives_the_logged_tokens(row: dict[str, Any]) -> None:
    ledger = _with_available_memory(plan(row), row["available_kv_gib"])
    error = (ledger.kv_pool_tokens - row["kv_cache_tokens"]) / row["kv_cache_tokens"]
    assert abs(error) <= _bound(ledger, row["available_kv_gib"]), (
        ledger.kv_pool_tokens,
        row["kv_cache_tokens"],
    )


@pytest.mark.parametrize("row", EXTRA, ids=[r["id"] for r in EXTRA])
def test_boots_whose_profile_is_not_plannable_check_their_kv_arithmetic(row: dict[str, Any]) -> None:
    ledger = _extra_ledger(row)
    error = (ledger.kv_pool_tokens - row["kv_cache_tokens"]) / row["kv_cache_tokens"]
    assert abs(error) <= _bound(ledger, row["available_kv_gib"]), (
        ledger.kv_pool_tokens,
        row["kv_cache_tokens"],
    )
    bound = (
        _bound(ledger, row["available_kv_gib"]) * row["max_concurrency"] + 0.006
    )  # the memory's and 2 decimals
    assert ledger.max_concurrency == pytest.approx(row["max_concurrency"], abs=bound)


def test_enough_rows_check_the_arithmetic() -> None:
    assert len(CALIBRATION_ROWS) >= 30
    assert any(
        r["config"]["model_type"].startswith("qwen3_5") for r in EXTRA
    )  # a hybrid state model on a GPU
    for row in EXTRA:
        assert row["source_url"].startswith("https://github.com/")
        assert row["excerpt"]
        assert row["config_note"]
