"""Recurrent-state layers (gated DeltaNet, Mamba2): their page, the block size they force, their blocks per request.

Every figure is vLLM 0.32.0's arithmetic (``sidecar/budget/state_layers.py`` cites each rule); the real CPU
engine agrees on tiny models (``tests/e2e/test_state_layers.py``). Before, the planner counted no state at all:
Qwen3-Next's pool was planned in blocks of 16 tokens of its attention layers alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.budget.architecture import LayerKind, architecture_from_config
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.parameters import computed_parameter_count
from sidecar.budget.state_layers import GATED_DELTA_NET, MAMBA2, StateRules, StateSpec, hybrid_block_size
from sidecar.errors import ConfigError, UsageError
from sidecar.units import GIB

CORPUS = Path(__file__).parents[1] / "data" / "hf-configs"
QWEN3_NEXT = StateSpec(GATED_DELTA_NET, conv_dim=8192, conv_kernel=4, heads=32, head_dim=128, state_dim=128)
NEMOTRON_H = StateSpec(
    MAMBA2,
    conv_dim=20480,
    conv_kernel=4,
    heads=256,
    head_dim=64,
    state_dim=256,
    groups=8,
    ssm_dtype="float32",
    chunk_size=128,
)
TINY_MAMBA2 = StateSpec(MAMBA2, conv_dim=160, conv_kernel=4, heads=4, head_dim=32, state_dim=16, groups=1)


def load(name: str):  # type: ignore[no-untyped-def] - the corpus' architecture
    return architecture_from_config(json.loads((CORPUS / name).read_text()))


def test_published_configs_give_the_state_shape_vllm_reads() -> None:
    assert load("Qwen--Qwen3-Next-80B-A3B-Thinking.json").state == QWEN3_NEXT
    assert load("nvidia--Nemotron-H-56B-Base-8K.json").state == NEMOTRON_H  # 256 x 64 + 2 x 8 x 256
    assert load("meta-llama--Llama-3.1-8B-Instruct.json").state is None


@pytest.mark.parametrize(
    ("spec", "tp", "ssm", "speculative", "page"),
    [
        (QWEN3_NEXT, 1, "auto", 0, 3 * 8192 * 2 + 32 * 128 * 128 * 2),  # 1,097,728: conv and state in bf16
        (QWEN3_NEXT, 4, "auto", 0, 3 * 2048 * 2 + 8 * 128 * 128 * 2),  # both split over TP
        (QWEN3_NEXT, 1, "float32", 0, 3 * 8192 * 2 + 32 * 128 * 128 * 4),  # --mamba-ssm-cache-dtype
        (QWEN3_NEXT, 1, "auto", 2, 5 * 8192 * 2 + 32 * 128 * 128 * 2),  # the conv window keeps the drafts
        (NEMOTRON_H, 1, "auto", 0, 3 * 20480 * 2 + 256 * 64 * 256 * 4),  # the config's float32 for auto
        (NEMOTRON_H, 1, "bfloat16", 0, 3 * 20480 * 2 + 256 * 64 * 256 * 2),
        (TINY_MAMBA2, 2, "auto", 0, 3 * (160 + 2 * 16) // 2 * 2 + 2 * 32 * 16 * 2),  # one group padded to two
    ],
)
def test_the_state_page_is_vllms(spec: StateSpec, tp: int, ssm: str, speculative: int, page: int) -> None:
    assert spec.page_bytes(tp, "bf16", ssm, speculative) == page


@pytest.mark.parametrize(
    ("block", "state_page", "per_token", "expected"),
    [
        (16, 1_097_728, 2048, 544),  # Qwen3-Next-80B, one GPU: 34 x 16 tokens of 2 KiB hold 1.05 MiB
        (16, 274_432, 1024, 272),  # at TP 4
        (128, 17_920, 256, 128),  # the tiny Qwen3-Next on the CPU engine: one page already holds it
        (128, 70_144, 256, 384),  # its wide variant: three 128-token steps
        (16, 0, 2048, 16),  # no state
        (1024, 1_097_728, 2048, 1024),  # a larger --block-size stays
        (24, 1_097_728, 2048, 560),  # 23 x 24 = 552 tokens, rounded up to the kernels' multiple of 16
    ],
)
def test_the_block_grows_until_an_attention_page_holds_a_state(
    block: int, state_page: int, per_token: int, expected: int
) -> None:
    assert hybrid_block_size(block, state_page, per_token) == expected


@pytest.mark.parametrize(
    ("minor", "spec", "caching", "speculative", "blocks"),
    [
        (32, QWEN3_NEXT, True, 0, 2),  # mode align: the running state and the cached one
        (32, NEMOTRON_H, True, 0, 3),  # Mamba2's prefill checkpoint (MambaMixer2.get_kv_cache_spec)
        (32, NEMOTRON_H, False, 0, 1),  # mode none
        (32, QWEN3_NEXT, True, 2, 4),  # a state per draft token
        (32, QWEN3_NEXT, False, 2, 3),
        (28, NEMOTRON_H, True, 0, 2),  # before the checkpoint
        (27, NEMOTRON_H, True, 0, 32),  # mode all: a state per block of the 512-token sequence
        (26, QWEN3_NEXT, True, 0, 2),  # DeltaNet classes had no mode all
    ],
)
def test_a_request_holds_the_release_s_state_blocks(
    minor: int, spec: StateSpec, caching: bool, speculative: int, blocks: int
) -> None:
    rules = StateRules(minor)
    mode = rules.mode(spec, prefix_caching=caching)
    assert (
        rules.blocks_per_request(spec, mode=mode, speculative_tokens=speculative, sequence_blocks=32)
        == blocks
    )


def test_mode_all_aligns_the_block_to_the_mamba2_chunk() -> None:
    """Nemotron-H-56B, one GPU, vLLM 0.27 with prefix caching: 4,126 tokens of 4 KiB hold a state: 4,224."""
    page = NEMOTRON_H.page_bytes(1, "bf16", "auto", 0)
    assert hybrid_block_size(16, page, 4096) == 4128  # align (0.28 on): 258 x 16
    assert hybrid_block_size(16, page, 4096, chunk=128) == 4224  # all: 33 x 128
    arch = load("nvidia--Nemotron-H-56B-Base-8K.json")
    for version, block in (("0.27.0", 4224), ("0.28.0", 4128)):
        request = PlanRequest(
            arch, 80 * GIB, max_model_len=8192, kv_cache_memory_bytes=20 * GIB, vllm_version=version
        )
        assert build_ledger(request).block_size == block


@pytest.mark.parametrize(("minor", "default"), [(20, False), (25, False), (26, True), (32, True)])
def test_hybrid_models_get_prefix_caching_by_default_from_0_26(minor: int, default: bool) -> None:
    assert StateRules(minor).prefix_caching_default() is default


def test_qwen3_next_plans_its_pool_in_544_token_blocks_of_four_groups() -> None:
    """80B-A3B at TP 4 on H100s, vLLM 0.32: 12 attention and 36 DeltaNet layers, groups of 12."""
    arch = load("Qwen--Qwen3-Next-80B-A3B-Thinking.json")
    ledger = build_ledger(
        PlanRequest(
            arch,
            80 * GIB,
            gpu="h100",
            max_model_len=32768,
            tensor_parallel_size=4,
            kv_cache_memory_bytes=20 * GIB,
        )
    )
    assert ledger.block_size == 272  # one KV head per GPU: 1 KiB a token, a 268 KiB state
    page = 272 * 1024
    assert ledger.kv_pool_blocks == 20 * GIB // (12 * page)
    per_request = 1 * -(-32768 // 272) + 3 * 2  # the attention group's blocks, two in each state group
    assert ledger.max_concurrency == round(ledger.kv_pool_blocks / per_request, 2)
    assert ledger.kv_pool_tokens == int(ledger.kv_pool_blocks / per_request * 32768)
    assert any("36 gated delta net state layers" in note for note in ledger.notes)


def test_without_prefix_caching_a_state_group_holds_one_block() -> None:
    arch = load("Qwen--Qwen3-Next-80B-A3B-Thinking.json")
    plan = {
        "gpu": "h100",
        "max_model_len": 32768,
        "tensor_parallel_size": 4,
        "kv_cache_memory_bytes": 20 * GIB,
    }
    on = build_ledger(PlanRequest(arch, 80 * GIB, **plan))  # type: ignore[arg-type]
    off = build_ledger(PlanRequest(arch, 80 * GIB, enable_prefix_caching=False, **plan))  # type: ignore[arg-type]
    assert off.kv_pool_blocks == on.kv_pool_blocks
    assert off.max_concurrency == round(off.kv_pool_blocks / (121 + 3), 2)


def test_a_state_family_not_modelled_keeps_its_layers_out_of_the_plan() -> None:
    config = json.loads((CORPUS / "Qwen--Qwen3-Next-80B-A3B-Thinking.json").read_text())
    config["model_type"] = "some_hybrid"  # layer_types-free, so every layer attends as before
    config["layer_types"] = [
        "linear_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    ] * 12
    arch = architecture_from_config(config)
    assert arch.state is None
    assert arch.unmodelled_state  # plan's notes say so (tests/unit/test_hybrid_families.py)
    assert LayerKind.STATE not in arch.layer_kinds
    assert arch.layer_kinds.count(LayerKind.NONE) == 36


def test_a_config_without_its_state_fields_is_one_line_of_error() -> None:
    config = json.loads((CORPUS / "nvidia--Nemotron-H-56B-Base-8K.json").read_text())
    config["mamba_num_heads"] = 0
    with pytest.raises(ConfigError, match="'mamba_num_heads'"):
        architecture_from_config(config)


def test_an_unknown_ssm_dtype_is_refused() -> None:
    arch = load("Qwen--Qwen3-Next-80B-A3B-Thinking.json")
    with pytest.raises(UsageError, match="Mamba SSM cache dtype 'fp8'"):
        build_ledger(
            PlanRequest(
                arch, 80 * GIB, max_model_len=4096, tensor_parallel_size=4, mamba_ssm_cache_dtype="fp8"
            )
        )


def test_a_granite_4_h_config_counts_its_mixers_experts_and_shared_mlp() -> None:
    """The e2e tier's tiny Granite-4.0-H: 2,018,692 parameters in the checkpoint transformers writes."""
    config = {
        "model_type": "granitemoehybrid", "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
        "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 1024, "tie_word_embeddings": False,
        "num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"], "mamba_n_heads": 4,
        "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 1,
        "num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 64, "torch_dtype": "bfloat16",
    }  # fmt: skip
    arch = architecture_from_config(config)
    assert arch.layer_kinds == (LayerKind.STATE, LayerKind.FULL, LayerKind.STATE, LayerKind.STATE)
    assert arch.state == StateSpec(
        MAMBA2, conv_dim=160, conv_kernel=4, heads=4, head_dim=32, state_dim=16, groups=1, chunk_size=256
    )  # transformers' default mamba_chunk_size
    assert computed_parameter_count(arch) == 2_018_692
