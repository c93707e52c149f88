"""MiniMax-M3's language model under the names its checkpoint uses (vLLM 0.32.0's ``MiniMaxM3TextConfig``,
whose defaults "mirror the text_config of the MiniMax-M3-preview checkpoint"; ``vllm/models/minimax_m3``).

Before 2026-12-07 ``moe_layer_freq`` and ``dense_intermediate_size`` were not read for it: all 60 layers were
planned with experts where vLLM gives the first three a dense MLP of 12,288 (447.19B parameters planned,
426.17B built: 21B, about 4.9 GiB a GPU at TP 8), and its MTP module (``num_mtp_modules``) was not seen.
"""

from __future__ import annotations

from typing import Any

from sidecar.budget import architecture_from_config, parameter_count

TEXT: dict[str, Any] = {
    "model_type": "minimax_m3_text", "vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 3072,
    "dense_intermediate_size": 12288, "shared_intermediate_size": 3072, "num_hidden_layers": 60,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 524288,
    "use_qk_norm": True, "num_local_experts": 128, "num_experts_per_tok": 4, "n_shared_experts": 1,
    "num_mtp_modules": 1, "moe_layer_freq": [0] * 3 + [1] * 57, "tie_word_embeddings": False,
}  # fmt: skip
CONFIG = {"architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
          "text_config": TEXT}  # fmt: skip


def test_the_first_three_layers_are_dense_and_wider() -> None:
    moe = architecture_from_config(CONFIG).moe
    assert moe is not None
    assert moe.moe_layers == tuple(range(3, 60))
    assert moe.dense_intermediate_size == 12288


def test_the_language_model_counts_as_vllm_builds_it() -> None:
    """vLLM's 426.17B less its sparse-attention indexers' 0.22B, which a plan note names."""
    arch = architecture_from_config(CONFIG)
    text = parameter_count(arch) - (arch.vision_parameters or 0)
    assert abs(text - 425.95e9) < 0.01e9


def test_the_mtp_module_is_a_draft_layer() -> None:
    assert architecture_from_config(CONFIG).draft_layers == 1
