"""Configs under the names vLLM 0.32.0's own config classes give them (``vllm/transformers_utils/configs``).

For these families vLLM reads the published checkpoints' own spellings, which transformers' classes (whose
defaults fill what a config omits) do not share; a default standing in for a field the config spells
otherwise is planned silently wrong. Step 3's ``moe_layers_enum`` and ``share_expert_dim`` (``Step3TextConfig``
and ``step3_text.py``) were not read: all 61 layers held experts and none a shared expert (338.79B planned
where vLLM builds 316.29B). DeepSeek-V4.1's compressed caches are not modelled; the plan says so.
"""

from __future__ import annotations

from typing import Any

from sidecar.budget import architecture_from_config, parameter_count
from sidecar.budget.layer_kinds import LayerKind
from sidecar.budget.moe import moe_from_config

STEP3_TEXT: dict[str, Any] = {  # Step3TextConfig's defaults, moe_layers_enum as the checkpoints write it
    "architectures": ["Step3TextForCausalLM"], "model_type": "step3_text", "hidden_size": 7168,
    "intermediate_size": 18432, "num_attention_heads": 64, "num_attention_groups": 1, "num_hidden_layers": 61,
    "vocab_size": 128815, "moe_intermediate_size": 5120, "moe_num_experts": 48, "moe_top_k": 3,
    "share_q_dim": 2048, "head_dim": 256, "moe_layers_enum": ",".join(str(i) for i in range(4, 60)),
}  # fmt: skip


def test_step3_experts_and_shared_expert_where_vllm_builds_them() -> None:
    arch = architecture_from_config(STEP3_TEXT)
    assert arch.moe is not None
    assert arch.moe.moe_layers == tuple(range(4, 60))
    assert (arch.moe.shared_experts, arch.moe.shared_intermediate_size) == (
        1,
        5120,
    )  # share_expert_dim's default
    assert (arch.moe.num_experts, arch.moe.experts_per_token, arch.num_kv_heads) == (48, 3, 1)


def test_step3_query_bottleneck_is_named_and_the_rest_counts() -> None:
    """vLLM's 316.29B; the plan's 4.22B beyond it is the query bottleneck, which its note names."""
    arch = architecture_from_config(STEP3_TEXT)
    assert abs(parameter_count(arch) - (316.29e9 + 4.22e9)) < 0.02e9
    assert any("share_q_dim" in feature for feature in arch.unmodelled_features)


BAILING_TEXT: dict[str, Any] = {  # BailingMoeV3VLConfig's text model, without the layer_types list
    "model_type": "bailing_hybrid", "vocab_size": 157184, "hidden_size": 2048, "intermediate_size": 5120,
    "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 4, "num_experts": 256,
    "num_experts_per_tok": 8, "moe_intermediate_size": 512, "first_k_dense_replace": 1, "head_dim": 128,
    "layer_group_size": 5, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "qk_nope_head_dim": 128,
}  # fmt: skip


def test_bailing_attends_every_layer_group_size_th_layer() -> None:
    """vLLM 0.32.0 (``bailing_moe_v3.py``, ``_is_kda_layer``) attends the last layer of each group of
    ``layer_group_size`` and any left over, whatever ``layer_types`` says; the rest are linear attention.
    Without the list all 20 layers were planned as MLA (five times the KV)."""
    config = {"architectures": ["BailingMoeV3VLForConditionalGeneration"], "model_type": "bailing_moe_v3_vl",
              "text_config": BAILING_TEXT}  # fmt: skip
    kinds = architecture_from_config(config).layer_kinds
    assert [i for i, kind in enumerate(kinds) if kind is LayerKind.FULL] == [4, 9, 14, 19]


def test_hy_v4_without_its_mlp_list_keeps_the_first_layer_dense() -> None:
    """``HYV4Config.__post_init__`` (transformers 5.19 and vLLM 0.32.0) fills ``mlp_layer_types`` with one
    dense layer first; the planner's defaults hold no lists, so layer 0 was planned with experts (+1.6B)."""
    moe = moe_from_config({"n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 768},
                          "hy_v4", 3072, 8)  # fmt: skip
    assert moe is not None
    assert [moe.is_moe_layer(i) for i in range(3)] == [False, True, True]
