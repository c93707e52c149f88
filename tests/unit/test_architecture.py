"""Architecture parsing on the catalog's real config.json contents and on the field fallbacks."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from sidecar.budget import (
    MODELS,
    LayerKind,
    PlanRequest,
    architecture_from_config,
    build_ledger,
    load_architecture,
    resolve_model,
)
from sidecar.budget.dtypes import weight_bytes_per_param
from sidecar.budget.parameters import computed_parameter_count
from sidecar.errors import ConfigError, UnknownModelError
from sidecar.units import GIB

# model id: layers, attention heads, KV heads, head dim, hidden, intermediate, vocab, tied, sliding layers
EXPECTED = {
    "llama-2-7b": (32, 32, 32, 128, 4096, 11008, 32000, False, 0),
    "llama-2-13b": (40, 40, 40, 128, 5120, 13824, 32000, False, 0),
    "llama-3-8b": (32, 32, 8, 128, 4096, 14336, 128256, False, 0),
    "llama-3.1-8b": (32, 32, 8, 128, 4096, 14336, 128256, False, 0),
    "llama-3.1-70b": (80, 64, 8, 128, 8192, 28672, 128256, False, 0),
    "mistral-7b": (32, 32, 8, 128, 4096, 14336, 32768, False, 0),
    "mixtral-8x7b": (32, 32, 8, 128, 4096, 14336, 32000, False, 0),
    "qwen2.5-0.5b": (24, 14, 2, 64, 896, 4864, 151936, True, 0),
    "qwen2.5-1.5b": (28, 12, 2, 128, 1536, 8960, 151936, True, 0),
    "qwen2.5-3b": (36, 16, 2, 128, 2048, 11008, 151936, True, 0),
    "qwen2.5-7b": (28, 28, 4, 128, 3584, 18944, 152064, False, 0),
    "qwen2.5-14b": (48, 40, 8, 128, 5120, 13824, 152064, False, 0),
    "qwen2.5-32b": (64, 40, 8, 128, 5120, 27648, 152064, False, 0),
    "qwen3-8b": (36, 32, 8, 128, 4096, 12288, 151936, False, 0),
    "gemma-2-9b": (42, 16, 8, 256, 3584, 14336, 256000, True, 21),
    "gemma-3-4b": (34, 8, 4, 256, 2560, 10240, 262208, True, 29),
    "deepseek-v3": (
        61,
        128,
        128,
        64,
        7168,
        18432,
        129280,
        False,
        0,
    ),  # head_dim: transformers sets qk_rope_head_dim (MLA caches the latent)
}


@pytest.mark.parametrize("model_id", sorted(EXPECTED))
def test_catalog_config_parses_to_published_shape(model_id: str) -> None:
    arch = resolve_model(model_id)
    layers, heads, kv, head_dim, hidden, inter, vocab, tied, sliding = EXPECTED[model_id]
    got = (
        arch.num_layers,
        arch.num_attention_heads,
        arch.num_kv_heads,
        arch.head_dim,
        arch.hidden_size,
        arch.intermediate_size,
        arch.vocab_size,
        arch.tie_word_embeddings,
        arch.layer_kinds.count(LayerKind.SLIDING),
    )
    assert got == (layers, heads, kv, head_dim, hidden, inter, vocab, tied, sliding)


def test_every_catalog_model_is_tested() -> None:
    assert {m.id for m in MODELS} == set(EXPECTED)


@pytest.mark.parametrize("model", MODELS, ids=[m.id for m in MODELS])
def test_computed_parameters_match_published_counts(model) -> None:  # type: ignore[no-untyped-def]
    computed = computed_parameter_count(resolve_model(model.id))
    assert computed == pytest.approx(model.published_parameters, rel=0.01)


@pytest.mark.parametrize(
    "text",
    [
        "Qwen/Qwen2.5-7B-Instruct",
        "qwen2.5-7b",
        "QWEN2.5-7B",
        "Qwen2.5-7B-Instruct",
        "qwen/qwen2.5-7b-instruct",
    ],
)
def test_model_ids_resolve(text: str) -> None:
    assert resolve_model(text).hidden_size == 3584


def test_hf_ids_of_all_catalog_models_resolve() -> None:
    for model in MODELS:
        assert resolve_model(model.hf_id) == resolve_model(model.id)


def test_unknown_model_names_the_catalog() -> None:
    with pytest.raises(UnknownModelError, match=r"unknown model 'gpt-5'.*qwen2\.5-7b"):
        resolve_model("gpt-5")


BASE = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512, "vocab_size": 1000}


@pytest.mark.parametrize(
    ("extra", "kv_heads"),
    [
        ({}, 8),
        ({"num_key_value_heads": 2}, 2),
        ({"multi_query_group_num": 2}, 2),
        ({"num_kv_heads": 4, "num_key_value_heads": 2}, 4),
        ({"n_head_kv": 1, "num_kv_heads": 4, "num_key_value_heads": 2}, 1),
        ({"num_key_value_heads": None, "multi_query_group_num": 4}, 4),
    ],
)
def test_kv_head_fallback_chain(extra: dict[str, int], kv_heads: int) -> None:
    assert architecture_from_config({**BASE, **extra}).num_kv_heads == kv_heads


@pytest.mark.parametrize(
    ("extra", "head_dim"),
    [({}, 64), ({"head_dim": 128}, 128), ({"hidden_size_per_head": 32}, 32), ({"head_dim": None}, 64)],
)
def test_head_dim_fallback(extra: dict[str, int], head_dim: int) -> None:
    assert architecture_from_config({**BASE, **extra}).head_dim == head_dim


def test_text_config_of_multimodal_models_wins() -> None:
    config = {
        "model_type": "llava",
        "torch_dtype": "float16",
        "text_config": {**BASE, "num_key_value_heads": 2},
    }
    arch = architecture_from_config(config)
    assert (arch.num_layers, arch.num_kv_heads, arch.dtype) == (4, 2, "fp16")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}, "FFFF"),
        (
            {
                "model_type": "qwen2",
                "sliding_window": 4096,
                "use_sliding_window": True,
                "max_window_layers": 2,
            },
            "FFSS",
        ),
        ({"model_type": "mistral", "sliding_window": 4096}, "SSSS"),
        ({"model_type": "mistral", "sliding_window": None}, "FFFF"),
        ({"model_type": "gemma2", "sliding_window": 4096}, "SFSF"),
        ({"model_type": "gemma3_text", "sliding_window": 1024, "sliding_window_pattern": 2}, "SFSF"),
        (
            {"sliding_window": 512, "layer_types": ["full_attention", "sliding_attention"] * 2},
            "FSFS",
        ),
    ],
)
def test_sliding_window_layers(extra: dict[str, object], expected: str) -> None:
    kinds = architecture_from_config({**BASE, **extra}).layer_kinds
    assert "".join("S" if k is LayerKind.SLIDING else "F" for k in kinds) == expected


def test_mla_is_one_latent_head_replicated_across_tensor_parallel_gpus() -> None:
    arch = resolve_model("deepseek-v3")
    assert arch.mla is not None
    assert arch.kv_elements_per_token_per_layer(1) == 512 + 64
    assert arch.kv_elements_per_token_per_layer(8) == 512 + 64
    assert arch.weight_dtype == "fp8"  # from quantization_config


def test_tensor_parallel_divides_kv_heads_but_never_below_one() -> None:
    arch = resolve_model("qwen2.5-7b")  # 4 KV heads
    assert [arch.kv_heads_per_gpu(tp) for tp in (1, 2, 4, 8)] == [4, 2, 1, 1]


def test_moe_spec_of_mixtral_and_deepseek() -> None:
    mixtral = resolve_model("mixtral-8x7b").moe
    deepseek = resolve_model("deepseek-v3").moe
    assert mixtral is not None
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)
    assert deepseek is not None
    assert (deepseek.num_experts, deepseek.shared_experts, deepseek.dense_layers) == (256, 1, 3)


def test_fp32_checkpoints_are_served_in_bf16() -> None:
    assert resolve_model("gemma-2-9b").weight_dtype == "bf16"


@pytest.mark.parametrize(
    ("quant", "dtype"),
    [
        ({"quant_method": "awq", "bits": 4}, "int4"),
        ({"quant_method": "gptq", "bits": 8}, "int8"),
        ({"quant_method": "fp8"}, "fp8"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4"),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
        # NVIDIA's NVFP4 checkpoints: 4-bit floats and an FP8 scale per 16, not FP8 (planned 78% heavy before)
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, "nvfp4"),
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "w4a16_nvfp4"}}, "nvfp4"),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "nvfp4-pack-quantized",
                "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
            },
            "nvfp4",
        ),
    ],
)
def test_quantization_config_sets_weight_dtype(quant: dict[str, object], dtype: str) -> None:
    assert architecture_from_config({**BASE, "quantization_config": quant}).weight_dtype == dtype


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ([], "JSON object"),
        ({"num_attention_heads": 8, "hidden_size": 512, "vocab_size": 10}, "num_hidden_layers"),
        ({**BASE, "num_hidden_layers": "four"}, "whole number"),
        ({**BASE, "vocab_size": 0}, "vocab_size"),
    ],
)
def test_malformed_configs_raise_config_error(config: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        architecture_from_config(config)  # type: ignore[arg-type]


def _write_safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    header = {
        name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in shapes.items()
    }
    header["__metadata__"] = {"format": "pt"}  # type: ignore[dict-item]
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_directory_with_only_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "torch_dtype": "bfloat16"}))
    arch = load_architecture(tmp_path)
    assert arch.parameter_count is None
    assert arch.parameter_source == "computed from config.json"


def test_safetensors_headers_give_the_exact_parameter_count(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": [1000, 512], "b": [512]})
    _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": [3, 4, 5]})
    arch = load_architecture(tmp_path)
    assert arch.parameter_count == 1000 * 512 + 512 + 60
    assert "safetensors headers (2 files)" in arch.parameter_source


def test_safetensors_index_total_size(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "torch_dtype": "bfloat16"}))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 2_000_000}})
    )
    assert load_architecture(tmp_path).parameter_count == 1_000_000


def test_corrupt_safetensors_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(ConfigError, match="safetensors"):
        load_architecture(tmp_path)


def test_directory_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"has no config\.json"):
        load_architecture(tmp_path)


@pytest.mark.parametrize(
    ("name", "elements"),
    [
        ("meta-llama--Llama-3.1-8B-Instruct.json", 131_072 * 128),  # llama3 RoPE: max_position_embeddings
        ("meta-llama--Llama-4-Scout-17B-16E-Instruct.json", 10_485_760 * 128),  # 2.5 GiB in bf16
        ("openai--gpt-oss-20b.json", 4096 * 32 * 64),  # YaRN: original_max_position_embeddings x factor
        ("deepseek-ai--DeepSeek-V3.json", 4096 * 40 * 64),  # YaRN over MLA's qk_rope_head_dim
        ("microsoft--phi-2.json", 2048 * 32),  # partial_rotary_factor 0.4 of 80
        ("google--gemma-2-9b-it.json", 8192 * 256),
        ("tiiuae--falcon-7b-instruct.json", 2048 * 64),  # alibi false: RoPE
    ],
)
def test_rope_tables_are_positions_times_rotary_dimension(name: str, elements: int) -> None:
    # vLLM's RotaryEmbeddingBase.cos_sin_cache (rotary_embedding/base.py, 0.32.0): sidecar.budget.rope
    config = json.loads((Path(__file__).parents[1] / "data" / "hf-configs" / name).read_text())
    assert architecture_from_config(config).rope_cache_elements == elements


def test_learned_position_families_have_no_rope_table() -> None:
    config = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257}
    assert architecture_from_config({**config, "n_positions": 1024}).rope_cache_elements == 0


def test_nvfp4_weights_take_four_and_a_half_bits_in_the_linear_layers_only() -> None:
    assert weight_bytes_per_param("nvfp4") == 0.5625
    nvfp4 = {**BASE, "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    assert architecture_from_config(nvfp4).packed_weights  # two values a byte: headers are not parameters


@pytest.mark.parametrize(("version", "said"), [("0.32.0", True), ("0.31.0", False)])
def test_a_bitsandbytes_checkpoint_is_named_where_vllm_has_no_such_method(version: str, said: bool) -> None:
    """vLLM 0.32.0's real server: '--quantization bitsandbytes' is 'Unknown quantization method'."""
    bnb = {**BASE, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    request = PlanRequest(architecture_from_config(bnb), 24 * GIB, max_model_len=4096, vllm_version=version)
    ledger = build_ledger(request)
    assert any("no bitsandbytes quantization" in note for note in ledger.notes) is said
