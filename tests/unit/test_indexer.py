"""DeepSeek-V3.2's sparse-attention indexer: its cache beside MLA's, its weights whole on every GPU (vLLM 0.32.0).

Before, the plan left the indexer out: the KV pool held 11% too many tokens at bf16 (a token costs 132 bytes
more in each of the 61 layers than the 1,152 of MLA's latent) and 23% too many at FP8, and each GPU of a TP-8
engine held 0.77 GiB of indexer weights the plan did not count.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger
from sidecar.budget.indexer import indexer_spec
from sidecar.budget.kv_terms import plan_gaps
from sidecar.budget.profile import indexer_replicas_bytes
from sidecar.units import GIB

CONFIG = json.loads(
    (Path(__file__).parents[1] / "data" / "hf-configs" / "deepseek-ai--DeepSeek-V3.2.json").read_text()
)
LAYERS = 61


def _ledger(kv_cache_dtype: str = "auto") -> tuple[PlanRequest, object]:
    request = PlanRequest(
        architecture_from_config(CONFIG), 8 * 141 * GIB, tensor_parallel_size=8, max_model_len=32768,
        kv_cache_dtype=kv_cache_dtype,
    )  # fmt: skip
    return request, build_ledger(request)


@pytest.mark.parametrize(("dtype", "latent"), [("auto", 576 * 2), ("fp8", 576)])
def test_a_token_costs_the_latent_and_the_indexer_key_in_every_layer(dtype: str, latent: int) -> None:
    """The indexer caches 128 FP8 values and one float32 scale a token, whatever the KV dtype."""
    request, ledger = _ledger(dtype)
    assert request.architecture.indexer is not None
    assert request.architecture.indexer.cache_bytes_per_token == 132
    assert ledger.kv_bytes_per_token == LAYERS * (latent + 132)  # type: ignore[attr-defined]
    fp8_note = any("fp8_ds_mla" in note for note in ledger.notes)  # type: ignore[attr-defined]
    assert fp8_note == (dtype == "fp8")
    assert plan_gaps(request.architecture) is None


def test_the_indexers_are_whole_on_every_gpu() -> None:
    """``wq_b`` at the checkpoint's FP8, ``wk_weights_proj`` 16-bit, the LayerNorm float32, on each of 8 GPUs."""
    request, _ = _ledger()
    whole = 1536 * 64 * 128 * 1 + 7168 * (128 + 64) * 2 + 2 * 128 * 4
    share = (1536 * 64 * 128 + 7168 * (128 + 64) + 2 * 128) * 1 / 8
    assert indexer_replicas_bytes(request) == round((whole - share) * LAYERS)
    assert indexer_replicas_bytes(request) > 0.75 * GIB


@pytest.mark.parametrize(
    ("extra", "indexed"),
    [
        ({}, set(range(8))),
        ({"index_topk_freq": 4}, {0, 1, 5}),  # max(i - 2 + 1, 0) % 4 == 0
        ({"index_topk_freq": 2, "index_skip_topk_offset": 0}, {1, 3, 5, 7}),
        ({"index_topk_pattern": "FFSFSSFF"}, {0, 1, 3, 6, 7}),
    ],
)
def test_the_layers_with_an_indexer(extra: dict[str, object], indexed: set[int]) -> None:
    """vLLM 0.32.0's ``DeepseekV32Attention``: ``index_topk_pattern``, else frequency and offset."""
    cfg = {"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128, "q_lora_rank": 1536, **extra}
    spec = indexer_spec(cfg, "deepseek_v32", 8)
    assert spec is not None
    assert spec.layers == indexed


def test_other_families_have_none() -> None:
    assert (
        indexer_spec({"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}, "deepseek_v3", 8)
        is None
    )
