"""``--model <Hugging Face id>``: resolved from a real HF cache layout built at test time, offline."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo

from sidecar.budget.catalog import resolve_model_source
from sidecar.budget.hub import looks_like_hub_id
from sidecar.budget.safetensors import draft_tensor_filter, hub_parameter_count
from sidecar.errors import ModelUnavailableError, UnknownModelError
from tests.fake_vllm import TINY_CONFIG
from tests.hf_cache import add_model


def safetensors(shapes: dict[str, list[int]]) -> bytes:
    """A valid safetensors file of zeros with these bf16 tensors."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 2 * shape[0] * shape[1]
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


@pytest.mark.parametrize(
    ("text", "hub"),
    [
        ("meta-llama/Llama-3.3-70B-Instruct", True),
        ("Qwen/Qwen2.5-7B-Instruct", True),
        ("qwen2.5-7b", False),
        ("a/b/c", False),
        ("../x", False),
        ("org/..", False),
    ],
)
def test_what_looks_like_a_hub_id(text: str, hub: bool) -> None:
    assert looks_like_hub_id(text) is hub


def test_a_model_outside_the_catalog_resolves_from_the_hf_cache(tmp_path: Path) -> None:
    snapshot = add_model(tmp_path, "acme/tiny-chat", {"config.json": TINY_CONFIG, "tokenizer.json": "{}"})
    resolved = resolve_model_source("acme/tiny-chat", cache_dir=tmp_path, offline=True)
    assert resolved.source == "hf-cache"
    assert resolved.directory == snapshot  # the tokenizer and chat template are read from here
    assert resolved.architecture.num_layers == TINY_CONFIG["num_hidden_layers"]
    assert resolved.architecture.parameter_source == "computed from config.json"


def test_the_revision_selects_the_snapshot(tmp_path: Path) -> None:
    add_model(tmp_path, "acme/tiny-chat", {"config.json": TINY_CONFIG})
    other = add_model(
        tmp_path, "acme/tiny-chat", {"config.json": TINY_CONFIG | {"num_hidden_layers": 6}}, branch="v2"
    )
    resolved = resolve_model_source("acme/tiny-chat", "v2", cache_dir=tmp_path, offline=True)
    assert (resolved.directory, resolved.architecture.num_layers) == (other, 6)


def test_weights_vllm_downloaded_give_the_exact_parameter_count(tmp_path: Path) -> None:
    weights = safetensors({"a": [4, 8], "b": [3, 5]})
    add_model(tmp_path, "acme/tiny-chat", {"config.json": TINY_CONFIG, "model.safetensors": weights})
    resolved = resolve_model_source("acme/tiny-chat", cache_dir=tmp_path, offline=True)
    assert resolved.architecture.parameter_count == 4 * 8 + 3 * 5
    assert resolved.architecture.parameter_source.startswith("safetensors headers")


def test_offline_and_not_cached_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailableError, match=r"acme/absent is not in .* HF_HUB_OFFLINE is set: mount"):
        resolve_model_source("acme/absent", cache_dir=tmp_path, offline=True)


def test_a_catalog_model_needs_no_cache_and_no_network(tmp_path: Path) -> None:
    resolved = resolve_model_source("Qwen/Qwen2.5-7B-Instruct", cache_dir=tmp_path, offline=True)
    assert (resolved.source, resolved.directory) == ("catalog", None)


def test_the_cache_wins_over_the_catalog(tmp_path: Path) -> None:
    add_model(tmp_path, "Qwen/Qwen2.5-7B-Instruct", {"config.json": TINY_CONFIG})
    resolved = resolve_model_source("Qwen/Qwen2.5-7B-Instruct", cache_dir=tmp_path, offline=True)
    assert resolved.source == "hf-cache"
    assert resolved.architecture.num_layers == TINY_CONFIG["num_hidden_layers"]


def test_neither_path_nor_id_nor_catalog() -> None:
    with pytest.raises(UnknownModelError, match=r"unknown model 'gpt-5': not a file or directory"):
        resolve_model_source("gpt-5")


DEEPSEEK_LIKE = TINY_CONFIG | {"num_nextn_predict_layers": 1}  # DeepSeek-V3's one MTP layer beside the model


def test_mtp_layers_vllm_does_not_load_are_not_counted(tmp_path: Path) -> None:
    layers = TINY_CONFIG["num_hidden_layers"]
    weights = safetensors({
        "model.layers.0.mlp.down_proj.weight": [4, 8],
        f"model.layers.{layers}.eh_proj.weight": [16, 8],  # the MTP layer: vLLM skips it without a drafter
        "mtp.fc.weight": [5, 5],  # Qwen3-Next's prefix, mapped to nothing
        "model.mtp_layers.0.fc.weight": [2, 2],  # MiMo's
    })  # fmt: skip
    add_model(tmp_path, "acme/mtp-chat", {"config.json": DEEPSEEK_LIKE, "model.safetensors": weights})
    resolved = resolve_model_source("acme/mtp-chat", cache_dir=tmp_path, offline=True)
    assert resolved.architecture.parameter_count == 4 * 8
    assert resolved.architecture.draft_layers == 1
    without = TINY_CONFIG  # no num_nextn_predict_layers: a layer past the last is not a draft's
    add_model(tmp_path, "acme/plain", {"config.json": without, "model.safetensors": weights})
    plain = resolve_model_source("acme/plain", cache_dir=tmp_path, offline=True).architecture
    assert plain.parameter_count == 4 * 8 + 16 * 8


def test_an_index_that_counts_mtp_layers_gives_no_count(tmp_path: Path) -> None:
    layers = TINY_CONFIG["num_hidden_layers"]
    index = {
        "metadata": {"total_size": 10**9},
        "weight_map": {"model.layers.0.a": "x.safetensors", f"model.layers.{layers}.b": "y.safetensors"},
    }
    add_model(
        tmp_path, "acme/mtp-index", {"config.json": DEEPSEEK_LIKE, "model.safetensors.index.json": index}
    )
    resolved = resolve_model_source("acme/mtp-index", cache_dir=tmp_path, offline=True)
    assert resolved.architecture.parameter_source == "computed from config.json"


def test_the_hubs_metadata_is_counted_without_the_mtp_layers() -> None:
    layers = TINY_CONFIG["num_hidden_layers"]
    tensors = {"model.layers.0.a": 32, f"model.layers.{layers}.b": 128, "mtp.c": 25}
    metadata = SafetensorsRepoMetadata(
        metadata=None, sharded=False, weight_map=dict.fromkeys(tensors, "model.safetensors"),
        files_metadata={"model.safetensors": SafetensorsFileMetadata(metadata={}, tensors={
            name: TensorInfo(dtype="BF16", shape=[count], data_offsets=(0, 2 * count)) for name, count in tensors.items()
        })},
    )  # fmt: skip
    assert hub_parameter_count(metadata, draft_tensor_filter(layers, 1)) == 32
    assert hub_parameter_count(metadata) == 32 + 128 + 25
    assert hub_parameter_count(object()) is None


@pytest.mark.parametrize(
    "quantization",
    [
        {"quant_method": "awq", "bits": 4, "group_size": 128},  # qweight: eight 4-bit weights an int32
        {"quant_method": "gptq", "bits": 8, "group_size": 128},  # four 8-bit weights an int32
        {"quant_method": "mxfp4"},  # gpt-oss: two values a byte in *_blocks
        {"quant_method": "bitsandbytes", "load_in_4bit": True},
        {"quant_method": "fp8", "expert_dtype": "fp4"},  # DeepSeek-V4/V4.1's experts
    ],
)
def test_packed_weights_headers_do_not_stand_for_parameters(
    tmp_path: Path, quantization: dict[str, Any]
) -> None:
    """A header's element count undercounts packed weights (an 8B AWQ checkpoint's headers sum to ~2.0B), so
    the config's arithmetic stands for those formats, from the cache and from the Hub alike."""
    config = TINY_CONFIG | {"quantization_config": quantization}
    weights = safetensors({"model.layers.0.mlp.qweight": [4, 8]})
    add_model(tmp_path, "acme/tiny-awq", {"config.json": config, "model.safetensors": weights})
    resolved = resolve_model_source("acme/tiny-awq", cache_dir=tmp_path, offline=True)
    assert resolved.architecture.parameter_source == "computed from config.json"
    assert resolved.architecture.packed_weights


def test_fp8_headers_still_count(tmp_path: Path) -> None:
    config = TINY_CONFIG | {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    add_model(
        tmp_path, "acme/tiny-fp8", {"config.json": config, "model.safetensors": safetensors({"a": [4, 8]})}
    )
    resolved = resolve_model_source("acme/tiny-fp8", cache_dir=tmp_path, offline=True)
    assert resolved.architecture.parameter_count == 32
