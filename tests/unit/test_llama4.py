"""Llama 4 read as transformers and vLLM define it: MoE layers, shared experts, chunked attention, vision.

The expected parameter counts are what transformers 5.19 builds on the ``meta`` device
(``AutoModelForImageTextToText.from_config``, as ``scripts/transformers_reference.py`` does) for the Scout
config of the corpus and for variants of it (the vLLM environment's Python; the variants are listed here).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger, parameter_count
from sidecar.budget.architecture import LayerKind
from sidecar.budget.kv_groups import KvGroups, chunked_local_blocks, kv_groups
from sidecar.budget.parameters import expert_parameter_count
from sidecar.units import GIB

SCOUT: dict[str, Any] = json.loads(
    (
        Path(__file__).parents[1] / "data/hf-configs/meta-llama--Llama-4-Scout-17B-16E-Instruct.json"
    ).read_text()
)
SMALL = {
    "hidden_size": 256, "intermediate_size": 128, "intermediate_size_mlp": 512, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000, "num_local_experts": 4,
}  # fmt: skip


def variant(**text: Any) -> dict[str, Any]:
    config = copy.deepcopy(SCOUT)
    config["text_config"].update(text)
    return config


# (case, config, total parameters transformers builds, its vision tower and projector, its moe_layers)
CASES = [
    ("scout", SCOUT, 108_641_793_536, 871_932_416, tuple(range(48))),
    ("maverick-like: 128 experts, step 2", variant(num_local_experts=128, interleave_moe_layer_step=2),
     401_583_781_376, 871_932_416, tuple(range(1, 48, 2))),
    ("small, step 2", variant(**SMALL, interleave_moe_layer_step=2), 857_641_728, 852_009_472, (1, 3, 5, 7)),
    ("small, step 4", variant(**SMALL, interleave_moe_layer_step=4), 857_443_072, 852_009_472, (3, 7)),
    ("small, moe_layers listed", variant(**SMALL, moe_layers=[0, 5]), 857_443_072, 852_009_472, (0, 5)),
    ("small, every layer MoE", variant(**SMALL), 858_039_040, 852_009_472, tuple(range(8))),
    ("small, no QK norm", variant(**SMALL, use_qk_norm=False), 858_039_040, 852_009_472, tuple(range(8))),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "config", "total", "vision", "moe_layers"), CASES, ids=[c[0] for c in CASES]
)
def test_parameters_match_the_model_transformers_builds(
    case: str, config: dict[str, Any], total: int, vision: int, moe_layers: tuple[int, ...]
) -> None:
    arch = architecture_from_config(config)
    assert arch.moe is not None
    assert tuple(i for i in range(arch.num_layers) if arch.moe.is_moe_layer(i)) == moe_layers, case
    assert arch.vision_parameters == vision, case
    assert parameter_count(arch) == total, case


def test_every_moe_layer_has_one_shared_expert_of_intermediate_size_and_dense_layers_the_mlp_width() -> None:
    arch = architecture_from_config(variant(num_local_experts=128, interleave_moe_layer_step=2))
    moe = arch.moe
    assert moe is not None
    assert (moe.shared_experts, moe.shared_intermediate_size, moe.expert_intermediate_size) == (1, 8192, 8192)
    assert moe.dense_intermediate_size == 16384  # intermediate_size_mlp
    assert arch.intermediate_size == 8192  # what transformers' config says (the corpus test compares it)
    assert expert_parameter_count(arch) == 24 * 128 * 3 * 5120 * 8192  # routed experts of the 24 MoE layers


@pytest.mark.parametrize(
    ("text", "full", "chunked", "chunk"),
    [
        ({}, 12, 36, 8192),  # no_rope_layers [] -> every fourth layer NoPE (full attention)
        ({"no_rope_layers": [1] * 47 + [0]}, 1, 47, 8192),  # as listed
        ({"attention_chunk_size": None}, 48, 0, None),  # no chunking: vLLM's Attention on every layer
        ({"attention_chunk_size": 4096}, 12, 36, 4096),
    ],
)
def test_rope_layers_attend_in_chunks_and_nope_layers_to_everything(
    text: dict[str, Any], full: int, chunked: int, chunk: int | None
) -> None:
    arch = architecture_from_config(variant(**text))
    assert arch.layer_kinds.count(LayerKind.FULL) == full
    assert arch.layer_kinds.count(LayerKind.CHUNKED) == chunked
    assert arch.attention_chunk_size == chunk


def test_transformers_5_layer_types_keep_chunked_layers_in_the_cache() -> None:
    config = {
        "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "vocab_size": 1000, "layer_types": ["chunked_attention", "full_attention"] * 2,
    }  # fmt: skip
    kinds = architecture_from_config(config).layer_kinds
    assert kinds == (LayerKind.CHUNKED, LayerKind.FULL) * 2  # not LayerKind.NONE (no KV)


def test_scout_forms_vllms_four_kv_cache_groups() -> None:
    # vLLM's "(FullAttention x 12) (ChunkedLocalAttention x 12) x 3" (vllm-project/vllm PR #21761)
    groups = kv_groups(architecture_from_config(SCOUT).layer_kinds)
    assert groups == KvGroups(full=1, sliding=0, layers_per_group=12, chunked=3)
    assert groups.hybrid


@pytest.mark.parametrize(
    ("max_model_len", "version", "blocks_per_request"),
    [
        (8192, "0.19.0", 4 * 512),  # the chunk is the whole request: as all-full
        (32768, "0.19.0", 2048 + 3 * 1024),  # chunked groups: cdiv(8192 + 8192 in flight, 16)
        (32768, "0.32.0", 2048 + 3 * 1536),  # async scheduling: two batches in flight from 0.26
        (32768, "0.18.0", 4 * 2048),  # before 0.19 planned as all-full
    ],
)
def test_chunked_groups_hold_one_chunk_plus_the_tokens_in_flight(
    max_model_len: int, version: str, blocks_per_request: int
) -> None:
    arch = architecture_from_config(SCOUT)
    request = PlanRequest(
        arch, 80 * GIB, gpu="NVIDIA H100 80GB", max_model_len=max_model_len, tensor_parallel_size=4,
        vllm_version=version, max_num_batched_tokens=8192, max_num_seqs=1024, gpu_memory_utilization=0.95,
    )  # fmt: skip
    ledger = build_ledger(request)
    pool_blocks = ledger.kv_pool_bytes // (16 * ledger.kv_bytes_per_token / 48 * 12)
    assert ledger.max_concurrency == pytest.approx(pool_blocks / blocks_per_request, abs=0.006)


def test_chunked_local_blocks_is_vllms_admission_cap() -> None:
    # ChunkedLocalAttentionSpec.max_admission_blocks_per_request: cdiv(min(chunk + in flight, len), block)
    assert chunked_local_blocks(8192, 8192, 8192, 16) == 512
    assert chunked_local_blocks(8192, 8192, 131072, 16) == 1024
    assert chunked_local_blocks(8192, 1, 131072, 16) == 513  # no extra block, unlike a sliding window
