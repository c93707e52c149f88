"""Hybrid families beyond Qwen3-Next and Nemotron-H: which layers attend, Falcon-H1's parallel mixers, and
what the plan says of a family whose state it does not model.

Before, a Jamba config was planned as 32 attention layers (eight times its KV per token), a Zamba2 config as
no attention at all (a pool of 0 tokens, "does-not-fit"), Falcon-H1 without its Mamba2 mixers, Mamba models
were refused as "not a decoder LLM?", and none of them said a word about the state vLLM keeps per sequence.
The layer rules cite vLLM 0.32.0's model files (``sidecar/budget/layer_kinds.py``); Falcon-H1's pool and
parameter count are checked on the real engine by ``tests/e2e/test_state_layers.py``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sidecar.budget.architecture import LayerKind, architecture_from_config
from sidecar.budget.kv_groups import KvGroups, kv_groups
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.parameters import computed_parameter_count
from sidecar.budget.state_layers import MAMBA1, MAMBA2, SHORT_CONV, StateRules, StateSpec
from sidecar.errors import ConfigError
from sidecar.units import GIB

F, S, N = LayerKind.FULL, LayerKind.STATE, LayerKind.NONE
GRANITE_STATE = StateSpec(MAMBA2, conv_dim=160, conv_kernel=4, heads=4, head_dim=32, state_dim=16, groups=1)
SMALL: dict[str, Any] = {
    "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 256,
    "vocab_size": 512, "max_position_embeddings": 1024, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip
FALCON_H1: dict[str, Any] = SMALL | {
    "model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"], "head_dim": 64, "num_hidden_layers": 2,
    "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4,
    "mamba_expand": 1, "mamba_d_ssm": 128,
}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "kinds"),
    [
        pytest.param(  # JambaConfig.layers_block_type: attention where i % period == offset
            {"model_type": "jamba", "num_hidden_layers": 8, "attn_layer_period": 4, "attn_layer_offset": 1},
            (S, F, S, S, S, F, S, S),
            id="jamba",
        ),
        pytest.param(  # KimiLinearConfig.is_kda_layer: 1-based kda_layers
            {
                "model_type": "kimi_linear",
                "num_hidden_layers": 4,
                "linear_attn_config": {"kda_layers": [1, 2, 3]},
            },
            (S, S, S, F),
            id="kimi-linear",
        ),
        pytest.param(  # lfm2.py: is_attn = layer_types[i] == "full_attention"; the rest short convolutions
            {"model_type": "lfm2", "num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"]},
            (S, F, S),
            id="lfm2",
        ),
        pytest.param(  # zamba2.py: a hybrid layer runs the shared attention block before its Mamba2 layer
            {
                "model_type": "zamba2",
                "num_hidden_layers": 3,
                "layers_block_type": ["mamba", "hybrid", "mamba"],
            },
            (S, F, S),
            id="zamba2",
        ),
        pytest.param(
            {"model_type": "falcon_h1", "num_hidden_layers": 2}, (F, F), id="falcon-h1-attends-everywhere"
        ),
    ],
)
def test_each_family_s_layers_attend_where_vllm_builds_attention(
    config: dict[str, Any], kinds: tuple[LayerKind, ...]
) -> None:
    from sidecar.budget.layer_kinds import layer_kinds  # noqa: PLC0415 - the rule itself, before state modelling

    merged = FALCON_H1 | config if config["model_type"] == "falcon_h1" else SMALL | config
    assert layer_kinds(merged, config["model_type"], config["num_hidden_layers"]) == kinds


def test_jamba_s_defaults_come_from_its_config_class() -> None:
    """A Jamba config that leaves out attn_layer_period and attn_layer_offset gets JambaConfig's 8 and 4."""
    arch = architecture_from_config(SMALL | {"model_type": "jamba", "num_hidden_layers": 16})
    assert arch.layer_kinds == (S, S, S, S, F, S, S, S) * 2
    assert arch.moe is not None
    assert [i for i in range(16) if arch.moe.is_moe_layer(i)] == [
        1,
        3,
        5,
        7,
        9,
        11,
        13,
        15,
    ]  # period 2, offset 1


def test_falcon_h1_runs_a_mamba2_mixer_beside_attention_in_every_layer() -> None:
    arch = architecture_from_config(FALCON_H1)
    assert arch.layer_kinds == (F, F)
    assert arch.kv_kinds == (F, F, S, S)  # vLLM: two attention layers in one group, two mixers in another
    assert kv_groups(arch.kv_kinds) == kv_groups((F, F, S, S))
    assert arch.state == StateSpec(
        MAMBA2, conv_dim=160, conv_kernel=4, heads=4, head_dim=32, state_dim=16, groups=1, chunk_size=256,
        gated_norm=False,
    )  # fmt: skip  # mamba_d_ssm 128 + 2 x 1 x 16; no gated norm without mamba_rms_norm (the config default)
    assert not arch.unmodelled_state


@pytest.mark.parametrize(
    ("extra", "parameters"),
    [
        pytest.param({}, 535_768, id="defaults"),
        pytest.param(
            {
                "mamba_rms_norm": True,
                "mamba_proj_bias": True,
                "projectors_bias": True,
                "mamba_conv_bias": False,
            },
            536_544,
            id="norm-and-biases",
        ),
        pytest.param({"attention_bias": True}, 536_536, id="attention-bias-on-o-proj-too"),
        pytest.param(
            {"mamba_d_ssm": None, "mamba_d_head": "auto", "mamba_expand": 2}, 635_352, id="auto-head"
        ),
    ],
)
def test_falcon_h1_parameters_are_transformers(extra: dict[str, Any], parameters: int) -> None:
    """``FalconH1ForCausalLM`` of transformers 5.19 built from each config counts ``parameters``."""
    assert computed_parameter_count(architecture_from_config(FALCON_H1 | extra)) == parameters


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(
            {"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "num_hidden_layers": 2,
             "linear_attn_config": {"kda_layers": [1]}},
            id="kimi-linear",
        ),
        pytest.param(  # a hybrid class by vLLM's registry, whose config declares no layer kinds
            {"model_type": "bailing_moe_linear", "architectures": ["BailingMoeV2_5ForCausalLM"], "num_hidden_layers": 2},
            id="registry-only",
        ),
    ],
)  # fmt: skip
def test_a_family_whose_state_is_not_modelled_says_so(config: dict[str, Any]) -> None:
    arch = architecture_from_config(SMALL | config)
    assert arch.state is None
    assert LayerKind.STATE not in arch.kv_kinds
    ledger = build_ledger(PlanRequest(arch, 24 * GIB, max_model_len=1024))
    assert any("recurrent state per sequence" in note and "not model" in note for note in ledger.notes)


def test_a_dense_model_gets_no_state_note() -> None:
    arch = architecture_from_config(
        SMALL | {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}
    )
    assert not any(
        "recurrent state" in note
        for note in build_ledger(PlanRequest(arch, 24 * GIB, max_model_len=1024)).notes
    )


@pytest.mark.parametrize("name", ["MambaForCausalLM", "Mamba2ForCausalLM", "FalconMambaForCausalLM"])
def test_an_attention_free_model_is_one_line_that_names_it(name: str) -> None:
    config = {
        "model_type": "mamba",
        "architectures": [name],
        "hidden_size": 768,
        "num_hidden_layers": 24,
        "vocab_size": 50280,
    }
    with pytest.raises(ConfigError, match=f"vLLM serves {name} without attention layers") as caught:
        architecture_from_config(config)
    assert "\n" not in str(caught.value)


# Tiny configs and the parameters transformers 5.19 builds from each (LFM2: Lfm2ForCausalLM; Jamba:
# JambaForCausalLM with use_mamba_kernels off); the e2e tier loads the first LFM2 in vLLM.
LFM2: dict[str, Any] = SMALL | {
    "model_type": "lfm2", "num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "conv"],
    "conv_L_cache": 3,
}  # fmt: skip
OLMO_HYBRID: dict[str, Any] = SMALL | {
    "model_type": "olmo_hybrid", "num_hidden_layers": 4, "num_key_value_heads": 2, "linear_num_key_heads": 2,
    "linear_num_value_heads": 2, "linear_key_head_dim": 32, "linear_value_head_dim": 64,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
}  # fmt: skip
JAMBA: dict[str, Any] = SMALL | {
    "model_type": "jamba", "num_hidden_layers": 4, "attn_layer_period": 4, "attn_layer_offset": 1,
    "expert_layer_period": 2, "expert_layer_offset": 1, "num_experts": 4, "num_experts_per_tok": 2,
    "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "parameters"),
    [
        pytest.param(LFM2, 772_480, id="lfm2"),  # MLP 2/3 of 256 = 170, rounded up to 256
        pytest.param(
            LFM2 | {"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"], "conv_L_cache": 4,
                    "conv_bias": True, "intermediate_size": 1000, "block_ffn_dim_multiplier": 1.5,
                    "block_multiple_of": 64},
            1_494_272,
            id="lfm2-biases-and-multiplier",
        ),
        pytest.param(
            LFM2 | {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"], "block_auto_adjust_ff_dim": False},
            443_520,
            id="lfm2-unadjusted-mlp",
        ),
        pytest.param(JAMBA, 1_515_000, id="jamba"),  # dt_rank auto: ceil(128 / 16) = 8
        pytest.param(OLMO_HYBRID, 792_652, id="olmo-hybrid"),  # q/k/v/g/a/b/o DeltaNet; full-width q, k norms
        pytest.param(
            SMALL | {"model_type": "olmo2", "num_hidden_layers": 2, "pad_token_id": 0}, 427_008, id="olmo2"
        ),
        pytest.param(
            JAMBA | {"num_hidden_layers": 2, "attn_layer_period": 2, "attn_layer_offset": 0, "num_experts": 1,
                     "mamba_d_state": 8, "mamba_d_conv": 3, "mamba_dt_rank": 12, "mamba_proj_bias": True,
                     "mamba_conv_bias": False},
            490_012,
            id="jamba-dense-with-biases",
        ),
    ],
)  # fmt: skip
def test_state_mixers_count_as_transformers_builds_them(config: dict[str, Any], parameters: int) -> None:
    assert computed_parameter_count(architecture_from_config(config)) == parameters


def test_lfm2_keeps_one_conv_window_per_conv_layer() -> None:
    """``short_conv_state_shape``: (conv_L_cache - 1 + k) x conv_dim / tp in the model's dtype, no SSM state."""
    arch = architecture_from_config(LFM2)
    assert arch.state == StateSpec(
        SHORT_CONV, conv_dim=128, conv_kernel=3, heads=0, head_dim=0, state_dim=0, conv_bias=False
    )
    assert arch.state.page_bytes(1, "bfloat16", "auto", 0) == 2 * 128 * 2
    assert arch.state.page_bytes(2, "bfloat16", "float32", 2) == 4 * 64 * 2  # the SSM dtype plays no part
    ledger = build_ledger(PlanRequest(arch, 24 * GIB, max_model_len=512, block_size=128, kv_cache_memory_bytes=GIB,
                                      async_scheduling=False))  # fmt: skip
    assert ledger.block_size == 128  # a 512-byte state fits a 128-token attention page (32 KiB)
    assert ledger.max_concurrency == round(
        ledger.kv_pool_blocks / (4 + 3 * 2), 2
    )  # 4 attention + 2 per conv group


@pytest.mark.parametrize(("minor", "slots"), [(28, 0), (29, 3), (32, 3)])
def test_lfm2_s_conv_window_holds_draft_tokens_from_0_29(minor: int, slots: int) -> None:
    """``short_conv_state_shape`` took ``num_spec`` from 0.29.0 (read in the 0.28.0 and 0.29.0 wheels)."""
    arch = architecture_from_config(LFM2)
    assert arch.state is not None
    assert StateRules(minor).conv_draft_slots(arch.state, 3) == slots


def test_jamba_s_mamba1_state_takes_no_draft_tokens() -> None:
    """``mamba1_state_shape``: conv (d_conv - 1) x inner / tp, temporal inner / tp x d_state; no speculative slots."""
    arch = architecture_from_config(JAMBA)
    assert arch.state is not None
    assert (arch.state.mixer, arch.state.conv_dim, arch.state.dt_rank) == (MAMBA1, 256, 8)
    assert arch.state.page_bytes(1, "bfloat16", "auto", 0) == 3 * 256 * 2 + 256 * 16 * 2
    assert StateRules(32).conv_draft_slots(arch.state, 3) == 0
    assert arch.state.page_bytes(2, "bfloat16", "float32", 0) == 3 * 128 * 2 + 128 * 16 * 4


@pytest.mark.parametrize(
    ("model_type", "extra", "feature"),
    [
        pytest.param(
            "gemma3n_text", {"intermediate_size": [256, 512]}, "per-layer MLP widths", id="gemma3n-widths"
        ),
        pytest.param(
            "llama", {"hidden_size_per_layer_input": 64}, "per-layer input embeddings", id="per-layer-inputs"
        ),
        pytest.param("llama", {"global_head_dim": 128}, "per-layer head sizes", id="global-heads"),
    ],
)
def test_gemma_3n_and_4_features_the_plan_does_not_model_are_named(
    model_type: str, extra: dict[str, Any], feature: str
) -> None:
    """Gemma 3n's list of MLP widths stopped ``plan`` ("must be a whole number"); now it plans, and says so
    where the widths differ (Gemma 3n's own per-layer inputs and Gemma 4's head sizes are modelled; the same
    fields in another family are named)."""
    config = SMALL | {"model_type": model_type, "num_hidden_layers": 2} | extra
    notes = build_ledger(PlanRequest(architecture_from_config(config), 24 * GIB, max_model_len=1024)).notes
    assert any(note.startswith("not modelled for this config:") and feature in note for note in notes)


@pytest.mark.parametrize(
    ("spec", "conv", "ssm", "page"),
    [
        pytest.param(GRANITE_STATE, "auto", "auto", 3 * 160 * 2 + 4 * 32 * 16 * 2, id="both-bf16"),
        pytest.param(GRANITE_STATE, "float32", "auto", 3 * 160 * 4 + 4 * 32 * 16 * 4, id="ssm-follows-conv"),
        pytest.param(GRANITE_STATE, "float32", "bfloat16", 3 * 160 * 4 + 4 * 32 * 16 * 2, id="ssm-flag-wins"),
        pytest.param(
            replace(GRANITE_STATE, ssm_dtype="float32"), "bfloat16", "auto", 3 * 160 * 2 + 4 * 32 * 16 * 4,
            id="model-hook-wins",
        ),
    ],
)  # fmt: skip
def test_mamba_cache_dtype_sets_the_conv_state_and_the_ssm_state_when_nothing_else_does(
    spec: StateSpec, conv: str, ssm: str, page: int
) -> None:
    """``_mamba_state_dtype`` (vLLM 0.15.0 to 0.32.0 alike): conv in ``--mamba-cache-dtype``, SSM in
    ``--mamba-ssm-cache-dtype``, else the model's hook (Nemotron-H, Qwen3.5), else the conv dtype."""
    assert spec.page_bytes(1, "bfloat16", ssm, 0, conv) == page


# Tiny Zamba2 configs and the parameters transformers 5.19 builds from each (Zamba2ForCausalLM, tied embeddings:
# only then does transformers tie the shared blocks, which vLLM always shares). The first is state_probe.py's.
ZAMBA2: dict[str, Any] = SMALL | {
    "model_type": "zamba2", "architectures": ["Zamba2ForCausalLM"], "num_hidden_layers": 6,
    "layers_block_type": ["mamba", "hybrid", "mamba", "mamba", "hybrid", "mamba"], "num_key_value_heads": 2,
    "n_mamba_heads": 8, "mamba_ngroups": 1, "mamba_d_state": 16, "adapter_rank": 8, "tie_word_embeddings": True,
}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "parameters"),
    [
        pytest.param({}, 1_068_368, id="one-shared-block"),  # six mixers, one block, two adapters, two linears
        pytest.param(
            {"num_mem_blocks": 2, "layers_block_type": ["hybrid", "mamba"] * 3}, 1_417_936, id="two-shared-blocks"
        ),
        pytest.param({"use_shared_attention_adapter": True}, 1_092_944, id="attention-adapters"),
        pytest.param({"add_bias_linear": True, "use_conv_bias": False}, 1_073_088, id="biases-conv-bias-kept"),
        pytest.param({"mamba_expand": 1, "n_mamba_heads": 4}, 765_704, id="expand-one"),
    ],
)  # fmt: skip
def test_zamba2_parameters_are_transformers(extra: dict[str, Any], parameters: int) -> None:
    """The shared blocks count once, each hybrid layer adds its adapters and ``linear``, every layer a mixer."""
    assert computed_parameter_count(architecture_from_config(ZAMBA2 | extra)) == parameters


@pytest.mark.parametrize(
    ("config", "blocks", "concurrency", "groups"),
    [
        pytest.param(FALCON_H1, 16_384, 2_340.57, KvGroups(1, 0, 2, state=1), id="falcon-h1"),
        pytest.param(ZAMBA2, 4_096, 315.08, KvGroups(1, 0, 2, state=3), id="zamba2"),
    ],
)
def test_a_state_model_s_pool_is_the_engines(
    config: dict[str, Any], blocks: int, concurrency: float, groups: KvGroups
) -> None:
    """The engine's figures for the e2e tier's models (vLLM 0.32 CPU, 1 GiB of KV, 128-token blocks, 512
    tokens, float32 SSM state; ``tests/e2e/test_state_layers.py``). Falcon-H1: an attention group and a state
    group of two layers. Zamba2: one attention group and three state groups of two (six Mamba2 mixers, two
    beside the hybrid layers' attention), 4 + 3 x 3 blocks a request; before, the plan counted its two
    attention layers alone and named the state as not modelled."""
    request = PlanRequest(
        architecture_from_config(config), 24 * GIB, max_model_len=512, block_size=128,
        kv_cache_memory_bytes=GIB, async_scheduling=False, mamba_ssm_cache_dtype="float32",
    )  # fmt: skip
    ledger = build_ledger(request)
    assert (ledger.block_size, ledger.kv_pool_blocks, ledger.max_concurrency) == (128, blocks, concurrency)
    assert kv_groups(request.architecture.kv_kinds) == groups
    assert not any("not model" in note for note in ledger.notes)


def test_zamba2_s_attention_heads_are_twice_as_wide_as_hidden_over_heads() -> None:
    """``zamba2.py``: the shared block attends over ``attention_hidden_size`` (2 x hidden) in heads of
    ``attention_head_dim``; the KV per token was planned at half of it."""
    config = SMALL | {
        "model_type": "zamba2",
        "num_hidden_layers": 2,
        "layers_block_type": ["mamba", "hybrid"],
    }
    assert architecture_from_config(config).head_dim == 2 * 128 // 2
    assert architecture_from_config(config | {"attention_head_dim": 96}).head_dim == 96


def test_a_hybrid_class_whose_config_has_no_state_layers_gets_no_note() -> None:
    """Granite-4.0-Micro is attention alone in GraniteMoeHybridForCausalLM, a class vLLM marks hybrid."""
    config = SMALL | {
        "model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "num_hidden_layers": 2,
        "layer_types": ["attention", "attention"], "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_expand": 1,
    }  # fmt: skip
    arch = architecture_from_config(config)
    assert arch.state is None
    notes = build_ledger(PlanRequest(arch, 24 * GIB, max_model_len=1024)).notes
    assert not any("recurrent state" in note for note in notes)
