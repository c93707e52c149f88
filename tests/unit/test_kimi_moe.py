"""Kimi Linear's and Kimi K3's experts as vLLM 0.32.0 builds them (``vllm/models/kimi_k3/nvidia/model.py``).

``KIMI_LINEAR`` restates moonshotai/Kimi-Linear-48B-A3B-Instruct's ``config.json`` from public copies of it;
``K3_TEXT`` the language model of Kimi K3's. Before 2026-12-07: their ``num_experts_per_token`` was not
read (top-1 routing planned: the MoE workspace an eighth of vLLM's), each GPU's share of Kimi-Linear's
1,024-wide experts at TP 8 was planned at 128 where ``KimiMoE`` pads it to 256 (11 GiB a GPU held beyond
the plan), and K3's routed experts were planned at the hidden width (7,168) where they run at its latent
``routed_expert_hidden_size`` (3,584): 5.48T parameters planned for a 2.8T model.
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger, parameter_count
from sidecar.budget.profile import loaded_weights_per_gpu
from sidecar.units import GIB

KDA = [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26]
KIMI_LINEAR: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_size": 2304,
    "intermediate_size": 9216, "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 27,
    "vocab_size": 163840, "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": True,
    "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4, "kda_layers": KDA,
                           "full_attn_layers": [4, 8, 12, 16, 20, 24, 27]},
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip
K3_TEXT: dict[str, Any] = KIMI_LINEAR | {
    "hidden_size": 7168, "intermediate_size": 33792, "num_attention_heads": 96, "num_key_value_heads": 96,
    "num_hidden_layers": 93, "q_lora_rank": 1536, "num_experts": 896, "num_experts_per_token": 16,
    "num_shared_experts": 2, "moe_intermediate_size": 3072, "routed_expert_hidden_size": 3584,
    "latent_moe_use_norm": True,
    "linear_attn_config": {"head_dim": 128, "num_heads": 96, "short_conv_kernel_size": 4,
                           "kda_layers": [i for i in range(1, 92) if i % 4], "full_attn_layers": [
                               *range(4, 93, 4), 93]},
}  # fmt: skip


def _weights(config: dict[str, Any], tp: int, *, ep: bool = False) -> float:
    request = PlanRequest(
        architecture_from_config(config), 80 * GIB, max_model_len=32768, tensor_parallel_size=tp,
        enable_expert_parallel=ep,
    )  # fmt: skip
    return build_ledger(request).weights_bytes / GIB


def test_kimi_routes_each_token_to_num_experts_per_token() -> None:
    moe = architecture_from_config(KIMI_LINEAR).moe
    assert moe is not None
    assert moe.experts_per_token == 8


@pytest.mark.parametrize(("tp", "ep", "padded"), [(4, False, 1024), (8, False, 2048), (8, True, 1024)])
def test_kimi_pads_each_gpus_share_of_an_expert_to_256(tp: int, ep: bool, padded: int) -> None:
    moe = architecture_from_config(KIMI_LINEAR).moe
    assert moe is not None
    assert moe.padded_width(tp, expert_parallel=ep) == padded


def test_kimi_linear_at_tp_8_holds_its_experts_twice() -> None:
    """At TP 8 without expert parallelism each GPU allocates 256 of an expert's 1,024 (not 128): its share of
    the routed experts (47.1B parameters, bf16) doubles, 11.0 GiB a GPU beyond the unpadded share."""
    routed = 26 * 256 * 3 * 2304 * 1024 * 2 / GIB  # MoE layers x experts x gate/up/down, bf16
    assert _weights(KIMI_LINEAR, 8) - _weights(KIMI_LINEAR, 8, ep=True) == pytest.approx(routed / 8, rel=1e-6)


def test_k3_experts_run_at_the_latent_width() -> None:
    arch = architecture_from_config({"architectures": ["KimiK3ForConditionalGeneration"],
                                     "model_type": "kimi_k3", "text_config": K3_TEXT})  # fmt: skip
    assert arch.moe is not None
    assert arch.moe.expert_hidden_size == 3584
    routed = 92 * 896 * 3 * 3584 * 3072
    latent = 92 * (2 * 7168 * 3584 + 3584)  # down and up projections, the norm
    assert routed + latent < parameter_count(arch) < routed + latent + 60 * 10**9  # attention, shared, vocab
    assert 2.7e12 < parameter_count(arch) < 2.8e12  # the model card's 2.8T (planned 5.48T before)


def test_k3_latent_projections_are_whole_on_every_gpu() -> None:
    """The latent down and up projections are ``ReplicatedLinear``: whole on each of 8 GPUs, not an eighth."""
    arch = architecture_from_config({"model_type": "kimi_k3", "text_config": K3_TEXT})
    params = parameter_count(arch)

    def loaded(tp: int) -> int:
        request = PlanRequest(
            arch, 80 * GIB, max_model_len=4096, tensor_parallel_size=tp, enable_expert_parallel=True
        )
        return loaded_weights_per_gpu(request, params)

    latent = 92 * (2 * 7168 * 3584 + 3584) * 2  # bf16
    assert loaded(8) * 8 - loaded(1) == pytest.approx(7 * latent, rel=0.01)


def test_quantization_published_in_text_config_is_read() -> None:
    """vLLM reads a multimodal config's ``quantization_config`` from ``text_config`` when the top has none."""
    quant = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int"}, "targets": ["Linear"]}}}  # fmt: skip
    config = {"model_type": "kimi_k3", "text_config": K3_TEXT | {"quantization_config": quant}}
    assert architecture_from_config(config).quantization == "int4"
