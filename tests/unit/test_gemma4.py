"""Gemma 4 as transformers 5.19 and vLLM 0.32 build it: parameters, KV geometry, the pool, admission's layout.

Table-driven at the boundaries of :mod:`sidecar.budget.gemma4`. The parameter counts are what transformers 5.19
builds (``Gemma4ForCausalLM(Gemma4TextConfig(**config))``, summed over ``parameters()``); the pools are what
vLLM 0.32.0's CPU engine reported for the same models (``tests/e2e/test_gemma4.py`` loads them: 1 GiB of KV,
128-token blocks, ``max_model_len`` 512). Before Gemma 4 was modelled, every layer had the sliding geometry
and the KV-shared layers held KV: 1,365.33 sequences planned for ``plain`` and 2,048 for ``shared``, both 862.32.
"""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.admission.geometry import GroupLayout, resolve_layout
from sidecar.budget.architecture import architecture_from_config
from sidecar.budget.kv_terms import kv_pages, layer_kv_bytes_per_token
from sidecar.budget.layer_kinds import LayerKind
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.parameters import computed_parameter_count
from sidecar.units import GIB

TINY: dict[str, Any] = {
    "model_type": "gemma4_text", "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2,
    "head_dim": 32, "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 1024,
    "tie_word_embeddings": True, "num_hidden_layers": 6, "sliding_window": 64, "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": 512,
}  # fmt: skip
PLAIN = TINY | {"global_head_dim": 64}
KEYS_ARE_VALUES = TINY | {"global_head_dim": 64, "attention_k_eq_v": True, "num_global_key_value_heads": 1}
SMALL_FULL = TINY | {"global_head_dim": 32, "attention_k_eq_v": True, "num_global_key_value_heads": 1}
SHARED = TINY | {
    "num_hidden_layers": 8, "global_head_dim": 64, "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 16,
}  # fmt: skip
MOE = KEYS_ARE_VALUES | {
    "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 64,
}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "parameters"),
    [
        pytest.param(PLAIN, 888_384, id="full-heads-of-64"),
        pytest.param(KEYS_ARE_VALUES, 863_808, id="keys-are-values"),  # no v_proj in the full layer
        pytest.param(TINY | {"global_head_dim": 64, "attention_k_eq_v": True}, 872_000, id="k-eq-v-own-heads"),
        pytest.param(  # transformers applies num_global_key_value_heads only with attention_k_eq_v
            TINY | {"global_head_dim": 64, "num_global_key_value_heads": 1}, 888_384, id="global-kv-ignored"
        ),
        pytest.param(SHARED, 1_250_992, id="kv-shared-and-per-layer-inputs"),
        pytest.param(
            TINY | {"num_hidden_layers": 8, "num_kv_shared_layers": 3, "use_double_wide_mlp": True},
            1_856_992,
            id="double-wide-mlp-in-shared-layers",
        ),
        pytest.param(MOE, 1_459_800, id="moe-block"),
        pytest.param(
            {"model_type": "gemma4_text"}, 5_077_177_856, id="transformers-defaults"
        ),  # heads of 512, per-layer inputs of 256 over a 262,144 vocabulary
        pytest.param(  # as transformers saves it: per_layer_config in place of the global fields
            TINY | {"per_layer_config": {"5": {"head_dim": 64, "num_key_value_heads": 1}}, "attention_k_eq_v": True},
            863_808,
            id="saved-per-layer-config",
        ),
    ],
)  # fmt: skip
def test_parameters_are_transformers(config: dict[str, Any], parameters: int) -> None:
    assert computed_parameter_count(architecture_from_config(config)) == parameters


@pytest.mark.parametrize(
    ("config", "blocks", "concurrency", "group_blocks"),
    [
        pytest.param(PLAIN, 16_384, 862.32, (128, 256), id="full-page-twice"),  # sliding blocks of 256
        pytest.param(KEYS_ARE_VALUES, 32_768, 1_129.93, (128, 128), id="equal-pages"),
        pytest.param(SMALL_FULL, 32_768, 1_213.63, (256, 128), id="full-page-half"),  # full blocks of 256
        pytest.param(SHARED, 16_384, 862.32, (128, 256), id="kv-shared-layers-hold-none"),
        pytest.param(MOE, 32_768, 1_129.93, (128, 128), id="moe"),
    ],
)
def test_the_pool_is_the_engines(
    config: dict[str, Any], blocks: int, concurrency: float, group_blocks: tuple[int, int]
) -> None:
    """The largest page sizes a block; a smaller page's layers hold ``ratio x 128`` tokens per block."""
    request = PlanRequest(
        architecture_from_config(config), 24 * GIB, max_model_len=512, block_size=128,
        kv_cache_memory_bytes=GIB, async_scheduling=False,
    )  # fmt: skip
    ledger = build_ledger(request)
    assert (ledger.block_size, ledger.kv_pool_blocks, ledger.max_concurrency) == (128, blocks, concurrency)
    assert not any(note.startswith("not modelled for this config:") for note in ledger.notes)
    assert _group_blocks(request) == group_blocks


def _group_blocks(request: PlanRequest) -> tuple[int, int]:
    kinds = request.architecture.kv_kinds
    blocks = kv_pages(request, kinds, layer_kv_bytes_per_token(request), request.block_size).blocks
    return blocks[LayerKind.FULL], blocks[LayerKind.SLIDING]


@pytest.mark.parametrize(
    ("version", "block_size", "group_blocks"),
    [
        pytest.param("0.29.0", 128, (128, 64), id="0.29-sliding-from-16"),  # 16 x 4: the full page is 4x
        pytest.param("0.30.0", 128, (256, 128), id="0.30-sliding-from-block-size"),
        pytest.param("0.24.0", 128, (256, 128), id="0.24-before-the-kernel-minimum"),
        pytest.param("0.29.0", 48, (48, 16), id="0.29-padded"),  # a 16-token sliding page padded to 48's
    ],
)
def test_a_sliding_block_starts_at_the_kernels_smallest_in_0_25_to_0_29(
    version: str, block_size: int, group_blocks: tuple[int, int]
) -> None:
    """``SMALL_FULL``: a full page half the sliding one at the same block size."""
    request = PlanRequest(
        architecture_from_config(SMALL_FULL), 24 * GIB, max_model_len=512, block_size=block_size,
        vllm_version=version,
    )  # fmt: skip
    assert _group_blocks(request) == group_blocks


def test_kv_per_token_counts_each_kind_at_its_geometry() -> None:
    """Five sliding layers of 2 x 2 x 32 elements and one full layer of 2 x 2 x 64, two bytes each."""
    ledger = build_ledger(PlanRequest(architecture_from_config(PLAIN), 24 * GIB, max_model_len=512))
    assert ledger.kv_bytes_per_token == 5 * 256 + 512
    shared = build_ledger(PlanRequest(architecture_from_config(SHARED), 24 * GIB, max_model_len=512))
    assert shared.kv_bytes_per_token == 5 * 256 + 512  # layers 6 and 7 read layers 4's and 5's KV


@pytest.mark.parametrize(
    ("config", "kinds"),
    [
        pytest.param(TINY, "SSSSSF", id="five-to-one"),
        pytest.param(TINY | {"num_hidden_layers": 8}, "SSSSSFSF", id="the-last-layer-is-full"),
        pytest.param(
            TINY | {"num_hidden_layers": 3, "layer_types": ["sliding_attention"] * 3}, "SSF", id="forced-full"
        ),
        pytest.param(TINY | {"sliding_window_pattern": 2}, "SSSSSF", id="the-pattern-is-not-read"),
    ],
)
def test_layer_kinds_are_transformers(config: dict[str, Any], kinds: str) -> None:
    """``Gemma4TextConfig.__post_init__``: 5:1 unless listed, and the last layer is made full."""
    arch = architecture_from_config(config)
    assert "".join("F" if kind is LayerKind.FULL else "S" for kind in arch.layer_kinds) == kinds


def test_the_global_geometry_defaults_and_kv_shared_layers() -> None:
    arch = architecture_from_config(TINY | {"num_kv_shared_layers": 2, "num_hidden_layers": 8})
    assert arch.full_attention_geometry() == (512, 2)  # global_head_dim's default
    assert arch.kv_kinds[-2:] == (LayerKind.NONE, LayerKind.NONE)
    assert arch.layer_kinds[-2:] == (LayerKind.SLIDING, LayerKind.FULL)  # their own attention is kept


def test_gemma_3n_kv_shared_layers_hold_no_kv() -> None:
    """Gemma 3n shares KV the same way (``gemma3n.py``'s ``kv_sharing_target_layer_name``)."""
    config = TINY | {"model_type": "gemma3n_text", "num_hidden_layers": 4, "num_kv_shared_layers": 2}
    arch = architecture_from_config(config)
    assert sum(kind.attends for kind in arch.kv_kinds) == 2


def test_a_window_that_spans_the_request_plans_one_block_more() -> None:
    """``SlidingWindowSpec.max_admission_blocks_per_request`` (0.15.0 to 0.32.0): ``cdiv(min(window - 1 +
    in flight, max_model_len), block) + 1``, never capped at the sequence's own blocks: 4 + 5 per group here."""
    config = {**TINY, "model_type": "gemma3_text", "sliding_window_pattern": 2, "num_hidden_layers": 2}
    request = PlanRequest(
        architecture_from_config(config), 24 * GIB, max_model_len=512, block_size=128,
        kv_cache_memory_bytes=GIB, async_scheduling=False,
    )  # fmt: skip
    ledger = build_ledger(request)
    assert ledger.kv_pool_blocks / ledger.max_concurrency == pytest.approx(4 + 5, rel=1e-3)


@pytest.mark.parametrize(
    ("layout", "tokens", "held", "reserved"),
    [
        pytest.param(GroupLayout(1, 5, 3, window_block=256), 512, 4 + 5 * 2, 4 + 5 * 3, id="sliding-blocks-of-256"),
        pytest.param(GroupLayout(1, 5, 3, window_block=256), 200, 2 + 5 * 1, 2 + 5 * 3, id="short"),
        pytest.param(GroupLayout(1, 5, 5, full_block=256), 512, 2 + 5 * 4, 2 + 5 * 5, id="full-blocks-of-256"),
    ],
)  # fmt: skip
def test_group_blocks_follow_each_groups_block(
    layout: GroupLayout, tokens: int, held: int, reserved: int
) -> None:
    assert (layout.blocks(tokens, 128), layout.reserved_blocks(tokens, 128)) == (held, reserved)


def test_admission_reads_the_engines_figure_with_scaled_blocks() -> None:
    """``plain`` reports 16,384 blocks and 862.32 sequences: 19 blocks, one full group of 4 and five of 3."""
    answer = resolve_layout(
        block_size=128, max_model_len=512, engine_blocks=19, groups=(1, 5, 0), group_blocks=(128, 256)
    )
    assert answer.layout == GroupLayout(1, 5, 3, window_block=256)
