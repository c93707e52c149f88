"""Every real config of the corpus (tests/data/hf-configs) plans, and reads as transformers reads it.

The reference (``transformers-reference.json``) is what transformers' own config classes and a model built
on the ``meta`` device say for each file; ``scripts/transformers_reference.py`` writes it and the e2e tier
regenerates it with the transformers of the vLLM environment, so this offline test compares with the real
thing, not with numbers copied from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger, parameter_count
from sidecar.budget.architecture import Architecture, LayerKind
from sidecar.budget.catalog import resolve_model
from sidecar.budget.parameters import computed_parameter_count
from sidecar.units import GIB

CORPUS = Path(__file__).parents[1] / "data" / "hf-configs"
REFERENCE: dict[str, Any] = json.loads((CORPUS / "transformers-reference.json").read_text())["configs"]
CONFIGS = sorted(p.name for p in CORPUS.glob("*.json") if p.name != "transformers-reference.json")
PARAMETER_TOLERANCE = 0.001  # 0.1%: gpt-oss's attention sinks and router biases are the largest gap inside it

FIELD_EXCEPTIONS = {
    # vLLM's FalconModelArchConfigConvertor: multi_query (without new_decoder_architecture) means one KV head,
    # whatever num_kv_heads says; transformers keeps the field as written. The KV cache follows vLLM.
    ("tiiuae--falcon-7b-instruct.json", "num_key_value_heads"): (1, 71),
}
PARAMETER_EXCEPTIONS = {  # (file): why, and the signed error bound
    # transformers 5.19 builds Mistral3ForConditionalGeneration tied by the top level's tie_word_embeddings
    # (Mistral3Config's default, True); vLLM 0.32.0 builds the language model from text_config
    # (init_vllm_registered_model(hf_config=config.text_config), models/mistral3.py) and ties by it
    # (MistralConfig's default, False), as the plan does: one more 131,072 x 5,120 matrix than transformers.
    "mistralai--Mistral-Small-3.1-24B-Instruct-2503.json": ("ties by text_config, as vLLM", 0.029),
}
TRANSFORMERS_CANNOT = {  # custom code (trust_remote_code): transformers has no class for them
    "moonshotai--Kimi-K2-Instruct.json",
    "nvidia--Llama-3_3-Nemotron-Super-49B-v1.json",
}


def load(name: str) -> Architecture:
    return architecture_from_config(json.loads((CORPUS / name).read_text()))


def test_the_corpus_is_large_and_fully_referenced() -> None:
    assert len(CONFIGS) >= 40
    assert set(REFERENCE) == set(CONFIGS)
    assert {n for n, r in REFERENCE.items() if "error" in r} == TRANSFORMERS_CANNOT


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_plans(name: str) -> None:
    arch = load(name)
    length = min(8192, arch.derived_max_model_len or 8192)
    ledger = build_ledger(PlanRequest(arch, 141 * GIB, max_model_len=length))
    assert ledger.kv_bytes_per_token > 0
    assert ledger.weights_bytes > 0


@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in TRANSFORMERS_CANNOT])
def test_architecture_fields_agree_with_transformers(name: str) -> None:
    arch, ref = load(name), REFERENCE[name]
    ours = {
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "vocab_size": arch.vocab_size,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "max_position_embeddings": arch.max_position_embeddings,
    }
    for field, value in ours.items():
        if ref.get(field) is None:
            continue
        expected = ref[field]
        if (name, field) in FIELD_EXCEPTIONS:
            assert (value, expected) == FIELD_EXCEPTIONS[name, field]
        else:
            assert value == expected, field


@pytest.mark.parametrize("name", [n for n in CONFIGS if n not in TRANSFORMERS_CANNOT])
def test_parameter_counts_agree_with_the_model_transformers_builds(name: str) -> None:
    total = REFERENCE[name]["parameters"]["total"]
    error = (parameter_count(load(name)) - total) / total
    if (
        name in PARAMETER_EXCEPTIONS
    ):  # beyond the tolerance (else the exception is stale) and within its bound
        bound = PARAMETER_EXCEPTIONS[name][1]
        assert PARAMETER_TOLERANCE < error <= bound if bound > 0 else bound <= error < -PARAMETER_TOLERANCE
    else:
        assert abs(error) <= PARAMETER_TOLERANCE


@pytest.mark.parametrize(
    ("name", "vision"),
    [("Qwen--Qwen2.5-VL-7B-Instruct.json", 676_550_144), ("llava-hf--llava-1.5-7b-hf.json", 324_487_168)],
)
def test_vision_towers_count(name: str, vision: int) -> None:
    assert REFERENCE[name]["parameters"]["vision"] == vision
    assert load(name).vision_parameters == vision


GEMMA3_TEXT = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
               "intermediate_size": 256, "vocab_size": 512, "num_hidden_layers": 2}  # fmt: skip
GEMMA4_TEXT = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32,
               "intermediate_size": 256, "vocab_size": 512, "num_hidden_layers": 6, "sliding_window": 64,
               "global_head_dim": 64, "hidden_size_per_layer_input": 0}  # fmt: skip
SIGLIP = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
          "image_size": 56, "patch_size": 14}  # fmt: skip
GEMMA4_VISION = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 16, "patch_size": 8, "position_embedding_size": 1024}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "vision"),
    [
        pytest.param({"model_type": "gemma3", "text_config": GEMMA3_TEXT, "vision_config": SIGLIP}, 147_456,
                     id="gemma3-siglip-with-head"),
        pytest.param({"model_type": "gemma3", "text_config": GEMMA3_TEXT,
                      "vision_config": SIGLIP | {"vision_use_head": False}}, 114_048, id="gemma3-as-published"),
        pytest.param({"model_type": "gemma4", "text_config": GEMMA4_TEXT, "vision_config": GEMMA4_VISION}, 244_576,
                     id="gemma4"),
        pytest.param({"model_type": "gemma4", "text_config": GEMMA4_TEXT, "vision_config": GEMMA4_VISION,
                      "audio_config": {"hidden_size": 64}}, 1_835_232, id="gemma4-with-audio"),  # E2B, E4B
    ],
)  # fmt: skip
def test_gemma_vision_towers_are_transformers(config: dict[str, Any], vision: int | None) -> None:
    """The towers and projectors ``Gemma3ForConditionalGeneration`` / ``Gemma4ForConditionalGeneration`` of
    transformers 5.19 build from each config (their parameters outside the language model; Gemma 4's audio
    tower too, since 2026-12-07: before, a config with one was planned without either tower)."""
    assert architecture_from_config(config).vision_parameters == vision


def test_gemma_3_4b_counts_as_the_hub_does() -> None:
    """The catalog's google/gemma-3-4b-it config: 4,300,079,472 parameters, transformers' count of its model
    with the vision tower (0.42B), which the plan had left out."""
    assert computed_parameter_count(resolve_model("gemma-3-4b")) == 4_300_079_472


@pytest.mark.parametrize(
    ("name", "noted"),
    [
        ("aya_vision", True),  # Aya Vision's tower: not modelled from config.json
        ("meta-llama--Llama-3.2-90B-Vision-Instruct.json", False),  # mllama's tower: counted since 2026-12-06
        ("Qwen--Qwen2.5-VL-7B-Instruct.json", False),  # counted
        ("Qwen--Qwen3-8B.json", False),  # no tower
    ],
)
def test_a_vision_tower_left_out_of_the_count_is_named(name: str, noted: bool) -> None:
    """Before, a tower the config does not give was left out silently: 0.9B of Llama-3.2-90B-Vision's weights."""
    if name == "aya_vision":  # LLaVA-1.5's config under a type whose tower the plan does not model
        arch = architecture_from_config(json.loads((CORPUS / "llava-hf--llava-1.5-7b-hf.json").read_text())
                                        | {"model_type": "aya_vision"})  # fmt: skip
    else:
        arch = load(name)
    notes = build_ledger(PlanRequest(arch, 80 * GIB, max_model_len=4096)).notes
    assert any("tower is not in the parameter count" in note for note in notes) is noted
    measured = arch.with_parameter_count(10**9, "safetensors")  # a measured count includes the tower
    assert not any(
        "vision tower" in n for n in build_ledger(PlanRequest(measured, 80 * GIB, max_model_len=4096)).notes
    )


def test_qwen_vl_without_sliding_windows_keeps_every_layer_full() -> None:
    # Qwen2.5-VL says use_sliding_window: false (and sliding_window 32768): every layer is full attention
    arch = load("Qwen--Qwen2.5-VL-7B-Instruct.json")
    assert set(arch.layer_kinds) == {LayerKind.FULL}
    per_token = build_ledger(PlanRequest(arch, 80 * GIB, max_model_len=128_000)).kv_bytes_per_token
    assert per_token * 128_000 / GIB == pytest.approx(6.84, abs=0.01)  # 28 x 2 x 4 x 128 x 2 B x 128K


def test_hybrid_models_hold_kv_only_in_their_attention_layers_and_a_state_in_their_mixers() -> None:
    nemotron = load("nvidia--Nemotron-H-56B-Base-8K.json")  # hybrid_override_pattern: "*" attends, "M" Mamba2
    assert nemotron.layer_kinds.count(LayerKind.FULL) == 10
    assert nemotron.layer_kinds.count(LayerKind.STATE) == 54
    assert nemotron.layer_kinds.count(LayerKind.NONE) == 54  # the "-" MLP layers
    qwen_next = load("Qwen--Qwen3-Next-80B-A3B-Thinking.json")  # full_attention_interval 4
    assert qwen_next.layer_kinds.count(LayerKind.FULL) == 12
    assert qwen_next.layer_kinds.count(LayerKind.STATE) == 36  # gated DeltaNet


def test_a_text_config_without_vocab_size_takes_transformers_default() -> None:
    # google/gemma-3-27b-it publishes text_config without vocab_size (Gemma3TextConfig's default: 262208)
    config = json.loads((Path(__file__).parents[2] / "sidecar/budget/models/gemma-3-4b.json").read_text())
    config["text_config"].pop("vocab_size", None)
    arch = architecture_from_config(config)
    assert arch.vocab_size == 262_208
    build_ledger(PlanRequest(arch, 24 * GIB, max_model_len=8192))


@pytest.mark.parametrize(
    ("name", "quantization"),
    [
        ("ibm-granite--granite-3.3-8b-instruct-FP8.json", "fp8"),  # compressed-tensors, float 8-bit weights
        ("openai--gpt-oss-20b.json", "mxfp4"),
        ("Qwen--Qwen2.5-14B-Instruct-AWQ.json", "int4"),
        ("Qwen--Qwen3-32B-FP8.json", "fp8"),
        ("meta-llama--Llama-3.1-8B-Instruct.json", None),
    ],
)
def test_quantised_checkpoints_are_recognised(name: str, quantization: str | None) -> None:
    assert load(name).quantization == quantization


def test_mxfp4_quantises_only_the_experts_and_pads_them_to_the_kernel_tiles() -> None:
    arch = load("openai--gpt-oss-20b.json")
    ledger = build_ledger(PlanRequest(arch, 80 * GIB, max_model_len=8192))
    bf16 = build_ledger(PlanRequest(arch, 80 * GIB, max_model_len=8192, weight_dtype="bf16"))
    experts = 24 * 32 * 3 * 2880 * 2880  # layers x experts x (gate, up, down) x hidden x expert width
    padded = 24 * 32 * 3 * 3072 * 2944  # hidden 2880 -> 3072 (256), expert width 2880 -> 2944 (128)
    rope = 4096 * 32 * 64 * 4  # YaRN RoPE table (original positions x factor x 64), float32 in gpt_oss.py
    expected = padded * 4.25 / 8 + (parameter_count(arch) - experts) * 2
    assert ledger.profile["weights"] == rope + round(expected)
    assert ledger.weights_bytes == round(
        experts * 4.25 / 8 + (parameter_count(arch) - experts) * 2
    )  # on paper
    assert ledger.profile["weights"] < bf16.profile["weights"] / 2.5
    # TP 2 pads each GPU's half: 1440 -> 1536; the H100 log of this model reads 7.01 GiB per GPU
    tp2 = build_ledger(PlanRequest(arch, 80 * GIB, max_model_len=8192, tensor_parallel_size=2))
    expected_tp2 = 24 * 32 * 3 * 3072 * 1536 * 4.25 / 8 + (parameter_count(arch) - experts) * 2 / 2
    assert tp2.profile["weights"] == rope + round(expected_tp2)
    assert 7.0 * GIB < tp2.profile["weights"] < 7.1 * GIB


def test_float32_serving_keeps_the_kv_cache_in_float32() -> None:
    arch = load("meta-llama--Llama-3.1-8B-Instruct.json")
    fp32 = build_ledger(PlanRequest(arch, 80 * GIB, max_model_len=8192, weight_dtype="fp32"))
    assert fp32.kv_bytes_per_token == 2 * 32 * 8 * 128 * 4


def test_mllamas_vision_tower_counts_as_transformers_builds_it() -> None:
    """``MllamaVisionModel`` and the projector (transformers 5.19), term by term: 926,490,131 for Llama-3.2-90B-Vision,
    which the plan had left out of the count (0.93B, 1.7 GiB of bf16 weights)."""
    name = "meta-llama--Llama-3.2-90B-Vision-Instruct.json"
    assert load(name).vision_parameters == REFERENCE[name]["parameters"]["vision"] == 926_490_131
