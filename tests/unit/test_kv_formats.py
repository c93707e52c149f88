"""vLLM's packed KV formats: bytes a head, boundary layers, the raised block, and where vLLM refuses them.

The bytes are vLLM 0.32.0's own (``TritonAttentionBackend.customize_spec`` and
``TurboQuantAttentionBackend.customize_spec`` run on a one-token, one-head spec with vLLM's python); the e2e
tier runs vLLM's grouping on whole models (``tests/e2e/test_kv_formats.py``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger, resolve_model
from sidecar.budget.kv_formats import KV_FORMATS, boundary_layer_count, packed_block_size
from sidecar.cli import main
from sidecar.errors import UsageError
from sidecar.units import GIB

CORPUS = Path(__file__).parents[1] / "data" / "hf-configs"
LLAMA = resolve_model("llama-3.1-8b")  # 32 layers, 8 KV heads of 128

# vLLM 0.32.0's page of one token in one KV head, at head sizes 64, 80, 128 and 256.
VLLM_HEAD_BYTES = {
    "int8_per_token_head": (136, 168, 264, 520),
    "fp8_per_token_head": (136, 168, 264, 520),
    "int4_per_token_head": (72, 88, 136, 264),
    "turboquant_k8v4": (100, 124, 196, 388),
    "turboquant_4bit_nc": (70, 86, 134, 262),
    "turboquant_k3v4_nc": (62, 76, 118, 230),
    "turboquant_3bit_nc": (54, 66, 102, 198),
}


@pytest.mark.parametrize("name", sorted(VLLM_HEAD_BYTES))
def test_a_heads_bytes_are_vllms(name: str) -> None:
    assert tuple(KV_FORMATS[name].head_bytes(h) for h in (64, 80, 128, 256)) == VLLM_HEAD_BYTES[name]


def _plan(kv: str, **changes: object) -> PlanRequest:
    return replace(PlanRequest(architecture=LLAMA, gpu_memory_bytes=80 * GIB, kv_cache_dtype=kv), **changes)


@pytest.mark.parametrize(
    ("kv", "per_token", "block"),
    [
        ("auto", 32 * 8 * 256 * 2, 16),
        ("int8_per_token_head", 32 * 8 * 264, 16),
        ("int4_per_token_head", 32 * 8 * 136, 16),
        # TurboQuant: layers 0, 1, 30 and 31 stay bf16; blocks of 32 so a page covers their 16-token page
        ("turboquant_k8v4", 4 * 8 * 512 + 28 * 8 * 196, 32),
        ("turboquant_3bit_nc", 4 * 8 * 512 + 28 * 8 * 102, 32),
    ],
)
def test_a_token_costs_each_layers_page_and_the_block_is_vllms(kv: str, per_token: int, block: int) -> None:
    ledger = build_ledger(_plan(kv))
    assert (ledger.kv_bytes_per_token, ledger.block_size) == (per_token, block)
    assert ledger.kv_pool_tokens == ledger.kv_pool_blocks * block  # "GPU KV cache size" at the raised block


@pytest.mark.parametrize(
    ("block", "version", "served", "expected"),
    [
        (16, "0.32.0", "bf16", 32),  # a16 x cdiv(16 x 2, 16)
        (128, "0.32.0", "bf16", 128),  # already covers it
        (48, "0.32.0", "bf16", 48),
        (16, "0.32.0", "fp32", 64),  # --dtype float32: 4-byte boundary layers
        (16, "0.24.0", "bf16", 16),  # _align_heterogeneous_kv_block_size is 0.25.0's
    ],
)
def test_the_block_is_raised_as_vllm_aligns_heterogeneous_pages(
    block: int, version: str, served: str, expected: int
) -> None:
    request = _plan("turboquant_k8v4", weight_dtype=served, block_size=block, vllm_version=version)
    assert packed_block_size(request, block) == expected


def test_boundary_layers_are_the_first_and_last_two_but_never_in_a_state_hybrid() -> None:
    assert boundary_layer_count(_plan("turboquant_k8v4")) == 4
    assert boundary_layer_count(_plan("int8_per_token_head")) == 0
    three = replace(LLAMA, num_layers=3)
    assert boundary_layer_count(_plan("turboquant_k8v4", architecture=three)) == 2  # min(2, 3 // 2): 0 and 2
    qwen3_next = architecture_from_config(
        json.loads((CORPUS / "Qwen--Qwen3-Next-80B-A3B-Thinking.json").read_text())
    )
    hybrid = PlanRequest(architecture=qwen3_next, gpu_memory_bytes=80 * GIB, kv_cache_dtype="turboquant_k8v4")
    assert boundary_layer_count(hybrid) == 0
    assert build_ledger(hybrid).kv_bytes_per_token > 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"vllm_version": "0.19.0"}, "vLLM 0.19.0 has no --kv-cache-dtype turboquant_k8v4 (from 0.20.0)"),
        ({"kv_cache_dtype": "int4_per_token_head", "vllm_version": "0.24.0"}, "(from 0.25.0)"),
        ({"kv_cache_dtype": "octave_k3v4"}, "is vLLM's but not modelled by the planner"),
        ({"kv_cache_dtype": "fp8_ds_mla"}, "is vLLM's but not modelled by the planner"),
    ],
)
def test_formats_vllm_lacks_or_the_planner_does_not_model_are_refused_in_one_line(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _plan("turboquant_k8v4", **changes)


def test_mla_models_and_early_hybrids_are_refused_as_vllm_refuses_them() -> None:
    deepseek = architecture_from_config(json.loads((CORPUS / "deepseek-ai--DeepSeek-V3.json").read_text()))
    with pytest.raises(UsageError, match="no MLA attention backend for --kv-cache-dtype int8_per_token_head"):
        PlanRequest(architecture=deepseek, gpu_memory_bytes=80 * GIB, kv_cache_dtype="int8_per_token_head")
    qwen3_next = architecture_from_config(
        json.loads((CORPUS / "Qwen--Qwen3-Next-80B-A3B-Thinking.json").read_text())
    )
    with pytest.raises(UsageError, match="refuses TurboQuant KV for models with state layers"):
        PlanRequest(
            architecture=qwen3_next, gpu_memory_bytes=80 * GIB, kv_cache_dtype="turboquant_4bit_nc",
            vllm_version="0.20.0",
        )  # fmt: skip


def test_plan_takes_vllms_spelling_and_says_where_the_bytes_go(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--kv-cache-dtype", "TurboQuant_K8V4"])
    out = capsys.readouterr().out
    assert code == 0
    assert "60,288 B/token" in out
    assert "196 bytes a token and KV head against 512" in out
    assert "4 boundary layers (the first and last 2)" in out


def test_a_windowed_model_under_turboquant_is_told_what_the_plan_leaves_out() -> None:
    sliding = "vLLM pads a boundary window layer's page"
    gemma = PlanRequest(resolve_model("gemma-2-9b"), 80 * GIB, kv_cache_dtype="turboquant_k8v4")
    assert any(sliding in note for note in build_ledger(gemma).notes)
    assert not any(sliding in note for note in build_ledger(_plan("turboquant_k8v4")).notes)
    assert not any(sliding in note for note in build_ledger(replace(gemma, kv_cache_dtype="fp8")).notes)
