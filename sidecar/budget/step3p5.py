"""Step 3.5's language model (Step-3.5-Flash, and Step 3.7's text model) as vLLM 0.32.0 builds it. Pure.

Read in vLLM 0.32.0 as installed (``vllm/model_executor/models/step3p5.py``: ``Step3p5DecoderLayer``,
``Step3p5Attention``, ``FusedMoEBlock``; ``vllm/transformers_utils/configs/step3p5.py``: ``Step3p5Config``)
and transformers 5.19's ``Step3p7TextConfig`` (``models/step3p7``), which reads the same checkpoints:

* **Two attention geometries.** A layer whose ``layer_types`` entry is ``attention_other_setting``'s
  ``attention_type`` (``sliding_attention`` in the published checkpoints) takes that setting's
  ``num_attention_heads``, ``num_attention_groups`` (its KV heads) and ``head_dim``; the others the top
  level's (``num_attention_groups`` is the KV head count, as transformers' ``attribute_map`` says). A config
  transformers 5 saved has ``num_sliding_attention_heads`` instead. Step-3.5-Flash: 64 query heads in its
  full layers, 96 in its sliding ones, 8 KV heads of 128 in both (:class:`sidecar.budget.mimo.MimoLayers`
  holds the two; the KV pages follow).
* **Per-layer lists longer than the model.** The checkpoints pad ``layer_types`` with their MTP layers'
  entries; ``Step3p5Config`` keeps the first ``num_hidden_layers``.
* **Attention extras**: q and k norms of the head size in every layer (:mod:`sidecar.budget.layer_shape`),
  and with ``use_head_wise_attn_gate`` a gate of one output per query head (``g_proj``, hidden x heads; off
  by default in vLLM's config class).
* **Experts** in the layers ``moe_layers_enum`` lists (a comma-separated string; vLLM's default without it:
  every layer but the first), a dense MLP of ``intermediate_size`` in the others; each MoE layer also holds
  one shared expert of ``share_expert_dim`` (default ``moe_intermediate_size x moe_top_k``; Step 3's
  ``step3_text.py`` follows the same rules, its shared expert 5,120 wide by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from sidecar.budget.config_fields import first_int
from sidecar.budget.mimo import AttentionHeads, MimoLayers, mimo_layers

STEP3P5_TYPES: Final = frozenset({"step3p5"})
"""Step 3.5's ``model_type``, also that of Step 3.7's ``text_config``."""
STEP_MOE_TYPES: Final = STEP3P5_TYPES | {"step3_text"}
"""Step 3's and Step 3.5's language models: experts where ``moe_layers_enum`` says, a shared expert each
(``step3_text.py``: ``share_expert_dim``, 5,120 when absent, ``Step3TextConfig``)."""
STEP3_SHARED_WIDTH: Final = 5120


def attention_geometries(
    cfg: Mapping[str, Any], model_type: str, heads: int, kv_heads: int, head_dim: int
) -> MimoLayers | None:
    """The sliding and full layers' geometries of MiMo-V2 or Step 3.5, ``None`` for any other family."""
    if model_type not in STEP3P5_TYPES:
        return mimo_layers(cfg, model_type, heads, kv_heads, head_dim)
    full = AttentionHeads(heads, kv_heads, head_dim, head_dim)
    other = cfg.get("attention_other_setting")
    sliding = AttentionHeads(
        first_int(cfg, "num_sliding_attention_heads") or heads, kv_heads, head_dim, head_dim
    )
    if isinstance(other, Mapping) and other.get("attention_type") == "sliding_attention":
        other_dim = first_int(other, "head_dim") or head_dim
        sliding = AttentionHeads(
            first_int(other, "num_attention_heads") or heads,
            first_int(other, "num_attention_groups") or kv_heads,
            other_dim,
            other_dim,
        )
    gate = cfg.get("use_head_wise_attn_gate") is True
    return MimoLayers(full, sliding, sliding_sinks=False, head_wise_gate=gate)


def step3p5_moe_layers(cfg: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The MoE layers: ``moe_layers_enum`` (a string or a list), else every layer but the first (vLLM)."""
    listed = cfg.get("moe_layers_enum")
    items = listed.split(",") if isinstance(listed, str) else listed if isinstance(listed, list) else None
    if items is None:
        return tuple(range(1, num_layers))
    return tuple(sorted({int(i) for i in items if str(i).strip().isdigit() and int(i) < num_layers}))


def step3p5_shared_width(cfg: Mapping[str, Any], model_type: str, expert_width: int, top_k: int) -> int:
    """One MoE layer's shared expert: ``share_expert_dim``, else its config class's default."""
    default = STEP3_SHARED_WIDTH if model_type == "step3_text" else expert_width * top_k  # Step3p5Config's
    return first_int(cfg, "share_expert_dim", "share_expert_dims") or default
