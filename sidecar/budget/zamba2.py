"""Zamba2's shared transformer blocks, as transformers 5.19 and vLLM 0.32.0 build them. Pure.

Read in transformers 5.19 (``models/zamba2/configuration_zamba2.py``, ``Zamba2Config.__post_init__``;
``modeling_zamba2.py``, ``Zamba2Model.get_layers``, ``Zamba2AttentionDecoderLayer``, ``Zamba2Attention``,
``Zamba2MLP``, ``Zamba2MambaMixer``) and vLLM 0.32.0 as installed (``vllm/model_executor/models/zamba2.py``):

* **Every layer runs a Mamba2 mixer**; a ``hybrid`` layer (``layers_block_type``, where transformers 5 writes
  ``linear_attention`` for the Mamba2 ones) first runs a shared transformer block on ``[hidden, embeddings]``
  (``attention_hidden_size`` = 2 x hidden, heads of ``attention_head_dim`` = 2 x hidden / heads), then a
  ``linear`` projection, then its Mamba2 layer. So in vLLM's pool each hybrid layer holds attention KV (its
  own ``Attention``: "KV cache is unique for every attention layer") and every layer a Mamba2 state
  (:func:`sidecar.budget.layer_kinds.parallel_state_layers`).
* vLLM's attention has as many KV heads as query heads (``QKVParallelLinear`` over ``num_attention_heads``),
  whatever ``num_key_value_heads`` says; the published checkpoints have them equal.
* **The shared blocks' weights are counted once**: ``num_mem_blocks`` blocks, used in turn by the hybrid
  layers (``block_id`` = hybrid index mod ``num_mem_blocks``), each with q/k/v from ``attention_hidden_size``,
  o to ``hidden``, a gated MLP of ``intermediate_size`` (biases with ``add_bias_linear``) and two norms; each
  hybrid layer adds its own LoRA-style adapter on the MLP's gate/up (``adapter_rank``) and, with
  ``use_shared_attention_adapter``, on q, k and v.
* The Mamba2 mixer's head size is ``mamba_expand x hidden / n_mamba_heads`` (``__post_init__`` recomputes it),
  its projections have biases with ``add_bias_linear``, and its conv has one whatever ``use_conv_bias`` says
  (``Zamba2MambaMixer``: ``bias=True``; vLLM loads it only with the flag, a few hundred parameters a layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.budget.config_fields import first_int

ZAMBA2: Final = "zamba2"
HYBRID: Final = "hybrid"
_ADAPTED_ATTENTION_PROJECTIONS = 3  # q, k and v


@dataclass(frozen=True, slots=True)
class Zamba2Blocks:
    """Zamba2's shared transformer blocks and what each hybrid layer adds to them."""

    hybrid_layers: int  # layers that run a shared block (and hold attention KV)
    mem_blocks: int  # num_mem_blocks: distinct shared blocks
    adapter_rank: int
    attention_adapters: bool  # use_shared_attention_adapter
    linear_bias: bool  # add_bias_linear (the MLP's and the Mamba2 projections')


def hybrid_layer_count(cfg: Mapping[str, Any]) -> int:
    """How many layers ``layers_block_type`` (transformers 5 also writes ``layer_types``) marks ``hybrid``."""
    kinds = cfg.get("layers_block_type") or cfg.get("layer_types") or []
    return sum(1 for kind in kinds if kind == HYBRID)


def zamba2_blocks(cfg: Mapping[str, Any], model_type: str) -> Zamba2Blocks | None:
    """Zamba2's shared blocks from its config (defaults merged), ``None`` for another family."""
    if model_type != ZAMBA2:
        return None
    return Zamba2Blocks(
        hybrid_layers=hybrid_layer_count(cfg),
        mem_blocks=max(1, first_int(cfg, "num_mem_blocks") or 1),
        adapter_rank=first_int(cfg, "adapter_rank") or 0,
        attention_adapters=bool(cfg.get("use_shared_attention_adapter", False)),
        linear_bias=bool(cfg.get("add_bias_linear", False)),
    )


def shared_parameters(spec: Zamba2Blocks, hidden: int, intermediate: int, attention: tuple[int, int]) -> int:
    """The shared blocks (counted once) and every hybrid layer's adapters and ``linear`` projection.

    ``attention``: (heads, head size); q, k and v read ``2 x hidden``.
    """
    heads, head_dim = attention
    wide, width = 2 * hidden, heads * head_dim
    bias = (2 * intermediate + hidden) if spec.linear_bias else 0
    block = 3 * wide * width + width * hidden + 3 * hidden * intermediate + bias + wide + hidden
    adapters = hidden * spec.adapter_rank + spec.adapter_rank * 2 * intermediate
    if spec.attention_adapters:
        adapters += _ADAPTED_ATTENTION_PROJECTIONS * 2 * wide * spec.adapter_rank
    blocks = min(spec.mem_blocks, spec.hybrid_layers)
    return blocks * block + spec.hybrid_layers * (adapters + hidden * hidden)
