"""Mixture-of-experts feed-forward layers, read from a ``config.json``: which layers, how wide. Pure.

Most families make every layer (DeepSeek: every layer after ``first_k_dense_replace``) a MoE layer of
``num_local_experts`` (``n_routed_experts``, ``num_experts``) experts of ``moe_intermediate_size``
(else ``intermediate_size``), with DeepSeek's ``n_shared_experts`` of the same width or one shared expert of
Qwen's ``shared_expert_intermediate_size`` or Granite's ``shared_intermediate_size``.

Llama 4 (``llama4_text``) is read as transformers 5.19 defines it (``models/llama4/configuration_llama4.py``,
``Llama4TextConfig.__post_init__``; ``modeling_llama4.py``, ``Llama4TextDecoderLayer``,
``Llama4TextMoe``), which vLLM 0.32.0 follows (``vllm/model_executor/models/llama4.py``, ``Llama4MoE``,
``Llama4DecoderLayer``):

* the MoE layers are ``moe_layers`` when the config lists them, else every ``interleave_moe_layer_step``-th
  layer (``range(step - 1, num_hidden_layers, step)``; vLLM: ``(layer_idx + 1) % step == 0``): Scout's
  step 1 makes all 48 MoE, Maverick's step 2 the odd ones;
* a MoE layer holds the routed experts (``Llama4TextExperts``: ``gate_up_proj`` and ``down_proj`` of
  ``intermediate_size``), the router (``Llama4Router``: ``hidden x num_local_experts``, no bias) and one
  shared expert (``shared_expert = Llama4TextMLP(config)``: a gated MLP of ``intermediate_size``);
* the other layers hold a gated MLP of ``intermediate_size_mlp`` (``Llama4TextMLP(config,
  intermediate_size=config.intermediate_size_mlp)``), not of ``intermediate_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.budget.config_fields import first_int
from sidecar.budget.gemma4 import GEMMA4_TYPES
from sidecar.budget.mimo import MIMO_TYPES, moe_layer_freq

LLAMA4_TYPES: Final = frozenset({"llama4", "llama4_text"})
_SHARED_GATE_TYPES = frozenset({"qwen2_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"})
ERNIE_MOE_TYPES: Final = frozenset({"ernie4_5_moe"})
LLAMA4_DENSE_INTERMEDIATE_DEFAULT: Final = 16384
"""``Llama4TextConfig.intermediate_size_mlp``'s default (transformers 5.19), for a config that omits it."""


@dataclass(frozen=True, slots=True)
class MoeSpec:
    """Mixture-of-experts feed-forward layers."""

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_experts: int = 0
    shared_intermediate_size: int = 0
    dense_layers: int = 0  # leading layers with an ordinary MLP (DeepSeek's first_k_dense_replace)
    moe_layers: tuple[int, ...] | None = None  # the MoE layers when not "every layer from dense_layers on"
    dense_intermediate_size: int | None = None  # the ordinary MLP's width when not intermediate_size
    shared_gate: bool = False  # Qwen2-MoE, Qwen3-Next, Qwen3.5: a hidden -> 1 gate on the shared expert

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (from 0) holds experts rather than an ordinary MLP."""
        if self.moe_layers is not None:
            return layer in self.moe_layers
        return layer >= self.dense_layers

    def moe_layer_count(self, num_layers: int) -> int:
        """How many of ``num_layers`` decoder layers hold experts."""
        return sum(1 for layer in range(num_layers) if self.is_moe_layer(layer))


def _llama4_moe_layers(cfg: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    listed = cfg.get("moe_layers")
    if isinstance(listed, list) and all(isinstance(i, int) for i in listed):
        return tuple(listed)
    step = first_int(cfg, "interleave_moe_layer_step")
    step = 1 if step is None else step
    return tuple(range(step - 1, num_layers, step)) if step > 0 else ()


def _ernie_moe_layers(cfg: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    start = first_int(cfg, "moe_layer_start_index") or 0
    end = first_int(cfg, "moe_layer_end_index")
    end = num_layers - 1 if end is None else end
    step = first_int(cfg, "moe_layer_interval") or 1
    return tuple(i for i in range(num_layers) if (i + 1) % step == 0 and start <= i <= end)


def _listed_moe_layers(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> tuple[int, ...] | None:
    """The MoE layers a family lists or patterns, ``None`` for "every layer from the dense ones on"."""
    moe_layers = None
    if model_type == "nemotron_h":  # only its "E" (transformers 5: "moe") blocks hold experts
        blocks = cfg.get("layers_block_type") or list(str(cfg.get("hybrid_override_pattern") or ""))
        moe_layers = tuple(i for i, block in enumerate(blocks) if block in ("E", "moe"))
    if model_type == "jamba":  # JambaConfig.layers_num_experts: experts where i % period == offset
        period, offset = first_int(cfg, "expert_layer_period"), first_int(cfg, "expert_layer_offset")
        if period and offset is not None:
            moe_layers = tuple(i for i in range(num_layers) if i % period == offset)
    if model_type in ERNIE_MOE_TYPES:
        moe_layers = _ernie_moe_layers(cfg, num_layers)
    if model_type in MIMO_TYPES:
        moe_layers = moe_layer_freq(cfg) or moe_layers
    kinds = cfg.get("mlp_layer_types")  # transformers 5: "dense" or "sparse" (DeepSeek-V4: "moe") per layer
    if isinstance(kinds, list) and kinds and all(isinstance(kind, str) for kind in kinds):
        moe_layers = tuple(i for i, kind in enumerate(kinds) if kind != "dense")
    return moe_layers


def moe_from_config(
    cfg: Mapping[str, Any], model_type: str, intermediate_size: int, num_layers: int
) -> MoeSpec | None:
    """The MoE layers of the language model ``cfg`` describes, or ``None`` for a dense model."""
    experts = first_int(cfg, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
    if not experts or experts <= 1:
        return None
    widths = cfg.get("moe_intermediate_size")
    text_width = None
    if isinstance(widths, list) and widths and all(isinstance(w, int) for w in widths):  # ERNIE 4.5 VL
        cfg, text_width = {**cfg, "moe_intermediate_size": sum(widths)}, widths[0]
    expert_size = first_int(cfg, "moe_intermediate_size", "expert_ffn_hidden_size") or intermediate_size
    top_k = first_int(cfg, "num_experts_per_tok", "moe_topk", "moe_k", "moe_top_k") or 1
    if model_type in LLAMA4_TYPES:
        return MoeSpec(
            num_experts=experts,
            experts_per_token=top_k,
            expert_intermediate_size=intermediate_size,
            shared_experts=1,
            shared_intermediate_size=intermediate_size,
            moe_layers=_llama4_moe_layers(cfg, num_layers),
            dense_intermediate_size=(
                first_int(cfg, "intermediate_size_mlp") or LLAMA4_DENSE_INTERMEDIATE_DEFAULT
            ),
        )
    if model_type in GEMMA4_TYPES:  # the MoE block runs beside each layer's dense MLP (budget.gemma4)
        if not cfg.get("enable_moe_block"):
            return None
        return MoeSpec(
            num_experts=experts,
            experts_per_token=first_int(cfg, "top_k_experts") or 1,
            expert_intermediate_size=expert_size,
            shared_experts=1,
            shared_intermediate_size=intermediate_size,
        )
    moe_layers = _listed_moe_layers(cfg, model_type, num_layers)
    if model_type == "nemotron_h" and not moe_layers:
        return None
    shared = first_int(cfg, "n_shared_experts", "moe_num_shared_experts", "num_shared_experts") or 0
    shared_size = shared * (text_width or expert_size)
    one_shared = first_int(cfg, "shared_expert_intermediate_size", "shared_intermediate_size")
    if one_shared:
        shared, shared_size = 1, one_shared
    return MoeSpec(
        num_experts=experts,
        experts_per_token=top_k,
        expert_intermediate_size=expert_size,
        shared_experts=shared,
        shared_intermediate_size=shared_size,
        dense_layers=first_int(cfg, "first_k_dense_replace", "num_dense_layers") or 0,  # LFM2-MoE: the latter
        moe_layers=moe_layers,
        shared_gate=model_type in _SHARED_GATE_TYPES,
    )
