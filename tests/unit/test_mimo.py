"""MiMo-V2-Flash: sliding and full layers of their own heads, values narrower than keys (vLLM 0.32.0).

The published checkpoint's ``config.json`` (``model_type`` ``mimo_v2``, custom code; the fields as the model's
public ports and vLLM 0.32.0's ``mimo_v2.py`` read them): 48 layers, ``hybrid_layer_pattern`` marking the
sliding ones, full layers of 4 KV heads with keys of 192 and values of 128, sliding layers of 8 such KV heads
over 128 tokens, experts where ``moe_layer_freq`` says. Before, the plan read it as a model with a
``sliding_window`` and no list: every layer windowed, 4 KV heads of 192 for keys and values alike, experts
in every layer.
"""

from __future__ import annotations

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger
from sidecar.budget.kv_terms import kv_pages, layer_kv_bytes_per_token, plan_gaps
from sidecar.budget.layer_kinds import LayerKind
from sidecar.units import GIB

LAYERS = 48
PATTERN = [0 if i % 6 == 0 else 1 for i in range(LAYERS)]  # one full layer in six (the real model: 8 of 48)
MIMO = {
    "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2", "torch_dtype": "bfloat16",
    "vocab_size": 152576, "hidden_size": 4096, "intermediate_size": 16384, "moe_intermediate_size": 2048,
    "num_hidden_layers": LAYERS, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192,
    "v_head_dim": 128, "swa_num_attention_heads": 64, "swa_num_key_value_heads": 8, "swa_head_dim": 192,
    "swa_v_head_dim": 128, "sliding_window": 128, "sliding_window_size": 128,
    "hybrid_layer_pattern": PATTERN, "moe_layer_freq": [0] + [1] * (LAYERS - 1), "n_routed_experts": 256,
    "num_experts_per_tok": 8, "add_swa_attention_sink_bias": True, "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
}  # fmt: skip


def _request(**overrides: object) -> PlanRequest:
    arguments: dict[str, object] = {"gpu_memory_bytes": 8 * 141 * GIB, "max_model_len": 32768}
    return PlanRequest(architecture_from_config(MIMO), **(arguments | overrides))  # type: ignore[arg-type]


def test_the_layers_slide_where_hybrid_layer_pattern_says() -> None:
    arch = architecture_from_config(MIMO)
    expected = tuple(LayerKind.SLIDING if p else LayerKind.FULL for p in PATTERN)
    assert arch.layer_kinds == expected
    assert arch.sliding_window == 128
    assert arch.moe is not None
    assert arch.moe.moe_layer_count(LAYERS) == LAYERS - 1
    assert not arch.moe.is_moe_layer(0)
    assert plan_gaps(arch) is None  # modelled: no note


@pytest.mark.parametrize(
    ("tp", "full", "sliding", "blocks"),
    [
        (1, 4 * (192 + 128) * 2, 8 * (192 + 128) * 2, {LayerKind.FULL: 32, LayerKind.SLIDING: 16}),
        (4, 1 * 320 * 2, 2 * 320 * 2, {LayerKind.FULL: 32, LayerKind.SLIDING: 16}),
        (8, 1 * 320 * 2, 1 * 320 * 2, {LayerKind.FULL: 16, LayerKind.SLIDING: 16}),
    ],
)
def test_each_kind_caches_its_own_keys_and_values(
    tp: int, full: int, sliding: int, blocks: dict[LayerKind, int]
) -> None:
    """``AttentionSpec``: KV heads split by TP, never below one, keys and values at their own sizes; the
    smaller page gets a larger block (``unify_kv_cache_spec_page_size``)."""
    request = _request(tensor_parallel_size=tp)
    kinds = request.architecture.kv_kinds
    pages = kv_pages(request, kinds, layer_kv_bytes_per_token(request), 16)
    assert pages.per_kind[LayerKind.FULL] == full
    assert pages.per_kind[LayerKind.SLIDING] == sliding
    assert {kind: pages.blocks[kind] for kind in blocks} == blocks


def test_a_long_sequence_costs_the_full_layers_per_token() -> None:
    """A token in every layer: 8 x 2,560 + 40 x 5,120 bytes at bf16 and TP 1; past the window, a sequence
    grows by the eight full layers' only."""
    ledger = build_ledger(_request())
    full_layers = PATTERN.count(0)
    assert ledger.kv_bytes_per_token == full_layers * 2560 + (LAYERS - full_layers) * 5120
    window_bytes = (LAYERS - full_layers) * 5120 * (128 + 16)  # the window and a block in flight, at most
    per_sequence = full_layers * 2560 * 32768
    assert per_sequence <= ledger.kv_bytes_per_sequence <= per_sequence + window_bytes


def test_transformers_5_layer_types_read_the_same() -> None:
    """transformers 5.19's ``mimo_v2_flash`` lists ``layer_types`` instead of the pattern."""
    listed = {k: v for k, v in MIMO.items() if k != "hybrid_layer_pattern"}
    listed["layer_types"] = ["sliding_attention" if p else "full_attention" for p in PATTERN]
    arch, published = architecture_from_config(listed), architecture_from_config(MIMO)
    assert arch.layer_kinds == published.layer_kinds
