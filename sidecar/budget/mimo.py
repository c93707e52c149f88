"""MiMo-V2-Flash's layers as vLLM 0.32.0 builds them: two attention geometries, values narrower than keys.

Pure.

Read in vLLM 0.32.0 as installed (``vllm/model_executor/models/mimo_v2.py``: ``MiMoV2FlashDecoderLayer``,
``MiMoV2Attention``; ``vllm/v1/kv_cache_interface.py``: ``AttentionSpec``) for the published checkpoint's
``config.json`` (``model_type`` ``mimo_v2``, custom code) and transformers 5.19's ``mimo_v2_flash``:

* **Sliding and full layers.** Layer ``i`` is a sliding-window layer when ``hybrid_layer_pattern[i] == 1``
  (``is_compressed_softmax_layer``), over ``sliding_window_size`` tokens (else ``sliding_window``); a config
  transformers 5 saved lists ``layer_types`` instead (:mod:`sidecar.budget.layer_kinds` reads that).
* **Each kind has its own heads.** A sliding layer has ``swa_num_attention_heads`` query heads and
  ``swa_num_key_value_heads`` KV heads of ``swa_head_dim`` (keys) and ``swa_v_head_dim`` (values); a full
  layer ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` and ``v_head_dim`` (a missing value
  size is the key size, vLLM's ``getattr`` default; a config with no ``swa_`` field at all, as transformers
  5.19's ``MiMoV2FlashConfig`` writes, has one geometry). MiMo-V2-Flash: 4 KV heads of 192 + 128 in its
  full layers, 8 in its sliding ones.
* **The KV page holds keys and values of their own sizes**: ``head_size + head_size_v`` elements per KV head
  and token (``AttentionSpec.state_content_size_bytes``), KV heads split by TP but never below one; the
  sliding and full pages then differ, and vLLM unifies them (:class:`sidecar.budget.kv_terms.KvPages`).
* **Experts** in the layers ``moe_layer_freq`` marks 1 (``is_moe_layer``), a dense MLP in the others.
* **Weights**: ``qkv_proj`` of ``heads x head_dim + kv_heads x (head_dim + v_head_dim)`` outputs, no bias
  on ``o_proj`` (``heads x v_head_dim`` inputs), a sink per query head in the sliding layers with
  ``add_swa_attention_sink_bias``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.budget.config_fields import first_int

MIMO_TYPES: Final = frozenset({"mimo_v2", "mimo_v2_flash"})


@dataclass(frozen=True, slots=True)
class AttentionHeads:
    """One kind of layer's attention: query heads, KV heads, key and value head sizes."""

    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int

    def kv_elements(self, tensor_parallel_size: int) -> int:
        """Cached elements one token adds to one such layer on one GPU (keys and values)."""
        return max(1, self.kv_heads // tensor_parallel_size) * (self.head_dim + self.v_head_dim)

    def parameters(self, hidden: int) -> int:
        """The layer's q, k, v and output projections, without biases."""
        qkv = hidden * (self.heads * self.head_dim + self.kv_heads * (self.head_dim + self.v_head_dim))
        return qkv + self.heads * self.v_head_dim * hidden


@dataclass(frozen=True, slots=True)
class MimoLayers:
    """Two attention geometries: MiMo-V2's (see the module docstring) and Step 3.5's (``budget.step3p5``)."""

    full: AttentionHeads
    sliding: AttentionHeads
    sliding_sinks: bool  # add_swa_attention_sink_bias: one learnt sink per query head
    head_wise_gate: bool = False  # Step 3.5's g_proj: hidden x query heads

    def attention_parameters(self, hidden: int, *, sliding: bool, qk_norm: bool) -> int:
        """One layer's attention weights: projections, sinks, q and k norms and gate of its kind."""
        heads = self.sliding if sliding else self.full
        total = heads.parameters(hidden) + (heads.heads if sliding and self.sliding_sinks else 0)
        total += 2 * heads.head_dim if qk_norm else 0
        return total + (hidden * heads.heads if self.head_wise_gate else 0)


def mimo_layers(
    cfg: Mapping[str, Any], model_type: str, heads: int, kv_heads: int, head_dim: int
) -> MimoLayers | None:
    """MiMo-V2's geometries from ``cfg`` (defaults filled in), ``None`` for any other family."""
    if model_type not in MIMO_TYPES:
        return None
    full = AttentionHeads(heads, kv_heads, head_dim, first_int(cfg, "v_head_dim") or head_dim)
    if not any(key.startswith("swa_") for key in cfg):  # transformers 5.19's MiMoV2Flash: one geometry
        return MimoLayers(full, full, bool(cfg.get("add_swa_attention_sink_bias")))
    swa_head_dim = first_int(cfg, "swa_head_dim") or head_dim
    sliding = AttentionHeads(
        first_int(cfg, "swa_num_attention_heads") or heads,
        first_int(cfg, "swa_num_key_value_heads") or kv_heads,
        swa_head_dim,
        first_int(cfg, "swa_v_head_dim") or swa_head_dim,
    )
    return MimoLayers(full, sliding, bool(cfg.get("add_swa_attention_sink_bias")))


def sliding_window(cfg: Mapping[str, Any], model_type: str) -> int | None:
    """The window of a model's sliding layers: ``sliding_window``, MiMo-V2's ``sliding_window_size`` first."""
    if model_type in MIMO_TYPES:
        return first_int(cfg, "sliding_window_size", "sliding_window")
    return first_int(cfg, "sliding_window")


def hybrid_pattern(cfg: Mapping[str, Any], num_layers: int) -> tuple[bool, ...] | None:
    """Whether each layer slides, by ``hybrid_layer_pattern`` (1: sliding), or ``None`` without one."""
    pattern = cfg.get("hybrid_layer_pattern")
    if isinstance(pattern, list) and len(pattern) == num_layers and all(isinstance(p, int) for p in pattern):
        return tuple(p == 1 for p in pattern)
    return None


def moe_layer_freq(cfg: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The layers ``moe_layer_freq`` gives experts (a list of 0 and 1), or ``None`` without the list."""
    marks = cfg.get("moe_layer_freq")
    if isinstance(marks, list) and all(isinstance(m, int) for m in marks):
        return tuple(i for i, mark in enumerate(marks) if mark)
    return None
