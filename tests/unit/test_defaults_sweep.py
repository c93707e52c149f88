"""Every family vLLM serves plans, and its parameter count agrees with the model transformers builds.

The corpus (``test_config_corpus.py``) holds the configs the team collected; this sweep holds the families
nobody collected: transformers 5.19's default config of every model type whose causal-LM or image-text class
vLLM 0.32.0 registers, written as a checkpoint writes it (only what differs from the class defaults), with
the parameter count of the model transformers builds from it on the ``meta`` device
(``scripts/transformers_defaults_sweep.py`` writes ``tests/data/transformers-defaults-sweep.json``; the e2e
tier regenerates it with ``--check``). A family the plan reads wrong shows here as a parameter count that is
off: ERNIE 4.5's experts (``moe_num_experts``) were not read at all (a 21.8B model planned as 3.3B), and
StarCoder2's, Arcee's, Apertus's and Jais2's two-matrix MLPs were counted with a gate (+27% to +38%).

A family still inexact is listed in ``EXCEPTIONS`` with why and its error bound; where the cause is a
feature of the config the plan does not model, the plan must name it (``plan_gaps``: ``plan``'s note and the
drift diagnosis). An exception that becomes exact fails the test, so the list cannot go stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger, parameter_count
from sidecar.budget.kv_terms import plan_gaps
from sidecar.budget.profile import mla_absorbed_bytes
from sidecar.budget.vision import vision_parameters
from sidecar.errors import ConfigError
from sidecar.units import GIB

SWEEP: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "data" / "transformers-defaults-sweep.json").read_text()
)["families"]
TOLERANCE = 0.001  # 0.1%, as the corpus: biases of routers and sinks are the largest gaps inside it
ATTENTION_FREE = {"mamba", "mamba2", "falcon_mamba"}  # refused in one line: no attention KV to plan
TRANSFORMERS_CANNOT = {  # transformers 5.19 cannot build a model from its own default config
    "cohere_compass", "dbrx", "diffusion_gemma", "gemma3n", "granite4_vision", "hunyuan_vl", "idefics3",
    "qwen4_exp", "qwen4_exp_text", "smolvlm",
}  # fmt: skip
NOTED = "noted"  # the plan names the feature it leaves out (plan_gaps)
TIES_BY_TEXT_CONFIG = (
    "its top level and its text_config disagree on tie_word_embeddings: transformers 5.19 ties by the top "
    "level, vLLM 0.32.0 builds the language model from text_config (with_hf_config) and ties by it, as the plan"
)
TOWER_SPLIT = "the reference splits the tower off by parameter names, which miss or overreach here"
EXCEPTIONS: dict[str, tuple[str, str, float]] = {  # family: (kind, why, signed error bound)
    "mistral3": ("tie", TIES_BY_TEXT_CONFIG, 0.03),
    "internvl": ("tie", TIES_BY_TEXT_CONFIG, 0.055),
    "qwen3_vl_moe": ("tie", TIES_BY_TEXT_CONFIG, -0.024),
    "glm5_next": (NOTED, "the indexer, hyper-connections", -0.003),
    "hy_v4": (NOTED, "the indexer, hyper-connections", -0.015),
    "inkling_text": (NOTED, "the sliding layers' own heads", -0.0012),
    "inkling_mm_model": (NOTED, "the sliding layers' own heads", -0.0013),
    "kimi_linear": (NOTED, "its KDA state layers", -0.005),
    "longcat_flash": (
        "engine",
        "transformers 5.19 gives the zero-computation experts a gate_up_proj too (768 x 4096 x 6144 where "
        "down_proj has 512); vLLM 0.32's FusedMoE holds the 512 routed experts only, as the plan (560.66B: the "
        "model card's 560B)",
        -0.25,
    ),
    "hrm_text": (NOTED, "its recurrent stacks", 1.83),
}
PLANNED = sorted(m for m, row in SWEEP.items() if "parameters" in row and m not in ATTENTION_FREE)


def _error(model_type: str) -> tuple[float, Any]:
    row = SWEEP[model_type]
    arch = architecture_from_config(row["config"])
    counted = row["parameters"]
    reference = counted["total"] - (counted["vision"] if arch.vision_parameters is None else 0)
    return (parameter_count(arch) - reference) / reference, arch


def test_the_sweep_covers_every_served_family() -> None:
    assert len(SWEEP) >= 130
    assert {m for m, row in SWEEP.items() if "error" in row} == TRANSFORMERS_CANNOT
    assert set(EXCEPTIONS) <= set(PLANNED)


@pytest.mark.parametrize("model_type", sorted(ATTENTION_FREE))
def test_attention_free_families_are_refused_in_one_line(model_type: str) -> None:
    with pytest.raises(ConfigError, match="without attention layers") as caught:
        architecture_from_config(SWEEP[model_type]["config"])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("model_type", sorted(m for m, row in SWEEP.items() if m not in ATTENTION_FREE))
def test_every_family_plans(model_type: str) -> None:
    arch = architecture_from_config(SWEEP[model_type]["config"])
    length = min(4096, arch.derived_max_model_len or 4096)
    ledger = build_ledger(PlanRequest(arch, 1000 * GIB, max_model_len=length))
    assert ledger.kv_bytes_per_token > 0 or arch.state is not None  # Granite-4.0-H's default: Mamba2 only
    assert ledger.weights_bytes > 0


@pytest.mark.parametrize("model_type", PLANNED)
def test_parameter_count_agrees_with_transformers(model_type: str) -> None:
    error, arch = _error(model_type)
    if model_type not in EXCEPTIONS:
        assert abs(error) <= TOLERANCE, f"{model_type}: {error:+.3%}"
        return
    kind, why, bound = EXCEPTIONS[model_type]
    assert abs(error) > TOLERANCE, f"{model_type} is now exact: drop its exception ({why})"
    assert 0 < error <= bound if bound > 0 else bound <= error < 0, f"{model_type}: {error:+.3%} ({why})"
    if kind == NOTED:
        assert plan_gaps(arch) is not None, f"{model_type}: the plan must name what it leaves out ({why})"


DBRX_INSTRUCT = {  # databricks/dbrx-instruct's config.json (its fields as published; the model card: 132B)
    "architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40,
    "max_seq_len": 32768, "vocab_size": 100352, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000},
    "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4},
}  # fmt: skip


def test_dbrx_reads_its_nested_attention_and_expert_fields() -> None:
    """transformers cannot build DBRX's default config, so its published one and model card stand in.

    Before: ``n_layers`` was not read and the config was refused ("is it a decoder LLM?").
    """
    arch = architecture_from_config(DBRX_INSTRUCT)
    assert (arch.num_layers, arch.num_attention_heads, arch.num_kv_heads, arch.head_dim) == (40, 48, 8, 128)
    assert arch.moe is not None
    assert (arch.moe.num_experts, arch.moe.experts_per_token) == (16, 4)
    assert arch.moe.expert_intermediate_size == 10752
    assert arch.max_position_embeddings == 32768
    assert parameter_count(arch) == pytest.approx(132e9, rel=0.005)


def test_a_config_resaved_by_transformers_5_plans_the_same_kv() -> None:
    """transformers 5 writes ``layer_types`` (``indexed_attention``, ``mlp_layer_types``) into configs it saves.

    Before: DeepSeek-V3.2's ``indexed_attention`` layers were read as holding no KV (a pool of 0 bytes a token).
    """
    corpus = Path(__file__).parents[1] / "data" / "hf-configs" / "deepseek-ai--DeepSeek-V3.2.json"
    published = json.loads(corpus.read_text())
    layers, dense = published["num_hidden_layers"], published["first_k_dense_replace"]
    resaved = {
        **published,
        "layer_types": ["indexed_attention"] * layers,
        "mlp_layer_types": ["dense"] * dense + ["sparse"] * (layers - dense),
    }
    ledgers = [
        build_ledger(PlanRequest(architecture_from_config(c), 8 * 141 * GIB, tensor_parallel_size=8,
                                 max_model_len=32768))
        for c in (published, resaved)
    ]  # fmt: skip
    assert ledgers[0].kv_bytes_per_token == ledgers[1].kv_bytes_per_token > 0
    assert ledgers[0].weights_bytes == ledgers[1].weights_bytes


HUNYUAN_A13B = {  # tencent/Hunyuan-A13B-Instruct's config.json, the fields the plan reads (model card: 80B total)
    "architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe", "hidden_size": 4096,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 3072, "moe_intermediate_size": [3072] * 32, "num_experts": 64, "moe_topk": [8] * 32,
    "num_shared_expert": [1] * 32, "vocab_size": 128167, "tie_word_embeddings": True, "use_qk_norm": True,
    "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_per_layer_expert_lists_plan() -> None:
    """HunYuan-A13B gives ``moe_topk`` and ``moe_intermediate_size`` per layer. Before: refused ("must be a
    whole number")."""
    arch = architecture_from_config(HUNYUAN_A13B)
    assert arch.moe is not None
    assert (arch.moe.num_experts, arch.moe.experts_per_token, arch.moe.expert_intermediate_size) == (
        64,
        8,
        3072,
    )
    assert parameter_count(arch) == pytest.approx(80e9, rel=0.02)


def test_longcat_flash_caches_two_latents_a_layer() -> None:
    """vLLM 0.32's ``FlashDecoderLayer`` has two MLA blocks (``self_attn.0``, ``self_attn.1``), each with its
    own cache and decode copies. Before: one latent a layer, the pool planned twice as large."""
    arch = architecture_from_config(SWEEP["longcat_flash"]["config"])
    request = PlanRequest(arch, 8 * 141 * GIB, tensor_parallel_size=8, max_model_len=8192)
    assert arch.mla is not None
    assert build_ledger(request).kv_bytes_per_token == arch.num_layers * 2 * arch.mla.latent_size * 2  # bf16
    heads = arch.num_attention_heads // 8
    copies = arch.mla.kv_lora_rank * heads * (arch.mla.qk_nope_head_dim + arch.mla.v_head_dim) * 2
    assert mla_absorbed_bytes(request) == arch.num_layers * 2 * copies
    assert plan_gaps(arch) is None


@pytest.mark.parametrize("model_type", ["gemma3", "llama4", "llava", "mistral3", "qwen2_5_vl", "qwen2_vl"])
def test_a_modelled_tower_is_transformers(model_type: str) -> None:
    """The vision tower and projector alone, where the plan counts them from config.json. Before: Mistral-Small
    3.1's Pixtral tower was not counted (0.44B here), and Qwen2-VL's merger was sized to the text width where
    transformers and vLLM 0.32 (``Qwen2VisionTransformer``) use the vision config's ``hidden_size``."""
    arch = architecture_from_config(SWEEP[model_type]["config"])
    assert arch.vision_parameters == SWEEP[model_type]["parameters"]["vision"]


def test_pixtral_under_llava_is_counted() -> None:
    """Pixtral-12B (``llava`` with a ``pixtral`` tower): 424,469,504 for transformers' default tower under llava."""
    vision = {
        "model_type": "pixtral",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
    }
    config = {"model_type": "llava", "vision_config": vision | {"num_attention_heads": 16, "patch_size": 16}}
    assert vision_parameters(config, 4096) == 424_469_504


@pytest.mark.parametrize(
    "model_type",
    ["qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "llava_next", "llava_next_video", "llava_onevision",
     "paligemma", "shieldgemma2", "glm4v", "glm4v_moe", "internvl", "cohere2_vision", "lfm2_vl",
     "paddleocr_vl", "qianfan_ocr", "cosmos3_edge", "aria", "minicpmv4_6", "minicpmv4_7", "glm_ocr", "glm5_next",
     "exaone4_5", "minimax_m3_vl", "muse_glimmer", "nemotron_h_omni", "step3p7"],
)  # fmt: skip
def test_towers_counted_since_2026_12_06_count_as_transformers_builds_them(model_type: str) -> None:
    """Qwen3-VL's tower with its deepstack mergers, Qwen3.5's without, LLaVA-NeXT's and OneVision's (LLaVA's and
    ``image_newline``), PaliGemma's, ShieldGemma 2's, GLM-4V's, InternVL's, Command A Vision's and LFM2-VL's
    (``sidecar/budget/vision.py``), and since 2026-12-07 PaddleOCR-VL's, Qianfan-OCR's, Cosmos3-Edge's, Aria's,
    MiniCPM-V 4.6's and 4.7's, GLM-OCR's, GLM-5-Next's, EXAONE 4.5's, MiniMax-M3-VL's, Muse Glimmer's,
    Nemotron-H Omni's and Step 3.7's (``sidecar/budget/vision_video.py`` for those that embed video): before,
    each was left out of the count (0.09B to 2.67B), with a note. BLIP-2's, ERNIE 4.5-VL's, Idefics3's and
    SmolVLM's, whose reference here splits off too little or too much by parameter names, or which
    transformers cannot build from the default, are checked in ``test_vision_towers.py``."""
    arch = architecture_from_config(SWEEP[model_type]["config"])
    assert arch.vision_parameters == SWEEP[model_type]["parameters"]["vision"]


@pytest.mark.parametrize("model_type", ["glm4", "glm_ocr"])
def test_glm4_text_layers_count_four_norms(model_type: str) -> None:
    """GLM-4-0414's and GLM-OCR's decoder layers norm after attention and after the MLP too (transformers 5.19
    ``Glm4DecoderLayer``; vLLM 0.32.0 ``glm4.py``, which GLM-4.1V's and GLM-OCR's text models are built
    with): counted as two, the plan was 327,680 parameters short on GLM-4's default, within the tolerance."""
    error, _ = _error(model_type)
    assert error == 0
