"""Step 3.5 (Step-3.5-Flash, and Step 3.7's text model) as vLLM 0.32.0 builds it (``sidecar.budget.step3p5``).

``STEP35`` restates Step-3.5-Flash's ``config.json`` from public projects' fixtures that quote it (its
attention fields with ``attention_other_setting``, ``moe_layers_enum``, ``share_expert_dim`` and the 1:3
full/sliding pattern); transformers 5.19 builds 196,956,118,272 parameters for it as Step 3.7's text model
(``Step3p7TextConfig`` reads these legacy fields; the model card says 196B). Before 2026-12-07 the plan read
none of them: every layer held experts (the first three are dense), no shared expert, no per-head gate and
64 query heads in the sliding layers where vLLM builds 96: 208.35B, and on eight 80 GiB GPUs a KV pool
2.65 GiB per GPU (12%) smaller than planned now.
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger, parameter_count
from sidecar.budget.layer_kinds import LayerKind
from sidecar.units import GIB

LAYERS = 45
STEP35: dict[str, Any] = {
    "architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5", "hidden_size": 4096,
    "num_hidden_layers": LAYERS, "vocab_size": 128896, "rms_norm_eps": 1e-5, "head_dim": 128,
    "num_attention_groups": 8, "num_attention_heads": 64, "intermediate_size": 11264,
    "moe_num_experts": 288, "moe_top_k": 8, "moe_intermediate_size": 1280, "share_expert_dim": 1280,
    "moe_layers_enum": ",".join(str(i) for i in range(3, LAYERS)), "sliding_window": 512,
    "use_head_wise_attn_gate": True,
    "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 96,
                                "num_attention_groups": 8, "head_dim": 128},
    "layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(LAYERS)],
    "max_position_embeddings": 262144, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}  # fmt: skip


def test_the_parameters_are_what_transformers_builds() -> None:
    assert parameter_count(architecture_from_config(STEP35)) == 196_956_118_272


def test_sliding_layers_take_their_own_heads_and_the_gate_follows_them() -> None:
    arch = architecture_from_config(STEP35)
    assert arch.mimo is not None
    assert (arch.mimo.full.heads, arch.mimo.sliding.heads, arch.num_kv_heads) == (64, 96, 8)
    sliding = arch.mimo.attention_parameters(4096, sliding=True, qk_norm=True)
    full = arch.mimo.attention_parameters(4096, sliding=False, qk_norm=True)
    assert sliding - full == 32 * 128 * 4096 * 2 + 32 * 4096  # 32 more heads: q and o, and their gates


@pytest.mark.parametrize(
    ("changes", "kv_heads", "experts", "top_k"),
    [
        ({}, 8, 288, 8),
        ({"num_attention_groups": 4, "moe_num_experts": 212, "moe_top_k": 4}, 4, 212, 4),  # beat the defaults
    ],
)
def test_step_field_names_beat_transformers_defaults(
    changes: dict[str, Any], kv_heads: int, experts: int, top_k: int
) -> None:
    """``num_attention_groups``, ``moe_num_experts`` and ``moe_top_k`` are Step's spellings of fields whose
    transformers defaults (8, 288, 8) used to stand in for them."""
    arch = architecture_from_config(STEP35 | changes)
    assert arch.moe is not None
    assert (arch.num_kv_heads, arch.moe.num_experts, arch.moe.experts_per_token) == (kv_heads, experts, top_k)


def test_moe_layers_and_the_shared_expert() -> None:
    moe = architecture_from_config(STEP35).moe
    assert moe is not None
    assert moe.moe_layers == tuple(range(3, LAYERS))
    assert (moe.shared_experts, moe.shared_intermediate_size) == (1, 1280)
    unlisted = {k: v for k, v in STEP35.items() if k not in ("moe_layers_enum", "share_expert_dim")}
    moe = architecture_from_config(unlisted).moe
    assert moe is not None
    assert moe.moe_layers == tuple(range(1, LAYERS))  # vLLM's default: all but the first
    assert moe.shared_intermediate_size == 1280 * 8  # Step3p5Config: moe_intermediate_size x moe_top_k


def test_layer_types_padded_with_the_mtp_layers_are_cut_to_the_model() -> None:
    padded = STEP35 | {"layer_types": [*STEP35["layer_types"], "full_attention", "sliding_attention",
                                       "sliding_attention"], "num_nextn_predict_layers": 3}  # fmt: skip
    kinds = architecture_from_config(padded).layer_kinds
    assert len(kinds) == LAYERS
    assert kinds.count(LayerKind.SLIDING) == 33  # not all 45 planned full


def test_the_sliding_layers_hold_a_window_of_kv() -> None:
    request = PlanRequest(
        architecture_from_config(STEP35), 80 * GIB, max_model_len=65536, tensor_parallel_size=8
    )
    ledger = build_ledger(request)
    assert ledger.kv_bytes_per_token == LAYERS * 2 * 1 * 128 * 2  # one KV head per GPU, K and V in bf16
    full_layers = 12
    assert ledger.kv_bytes_per_sequence < 2 * full_layers * 128 * 2 * 65536 * 1.1  # the windows add little
