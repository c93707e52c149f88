"""LongCat-Flash's layers as vLLM 0.32.0 builds them: two attention blocks and two MLPs beside experts. Pure.

Read in vLLM 0.32.0 as installed (``vllm/model_executor/models/longcat_flash.py``: ``FlashDecoderLayer``,
``LongcatRouter``, ``LongcatMoe``) and transformers 5.19 (``models/longcat_flash``), which build the same
tensors: each of ``num_layers`` decoder layers holds

* **two MLA attention blocks** (``self_attn.0``, ``self_attn.1``), each with its own KV cache: a token costs
  two latents a layer, and vLLM keeps two sets of MLA's decode copies;
* **two dense MLPs** of ``ffn_hidden_size`` (``mlps.0``, ``mlps.1``) and four norms;
* **one MoE block** of ``n_routed_experts`` experts of ``expert_ffn_hidden_size``, whose router also scores
  ``zero_expert_num`` zero-computation experts (identity experts with no weights) and keeps a correction bias
  per scored expert.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.budget.config_fields import first_int

LONGCAT_TYPES: Final = frozenset({"longcat_flash"})
ATTENTION_BLOCKS: Final = 2


@dataclass(frozen=True, slots=True)
class LongcatLayers:
    """What a LongCat-Flash layer holds beyond one attention block and one MoE block."""

    zero_experts: int  # identity experts the router scores besides the routed ones

    def router_extras(self, hidden: int, experts: int) -> int:
        """The router's rows for the zero experts and its correction bias over every scored expert."""
        return hidden * self.zero_experts + experts + self.zero_experts


def longcat_layers(cfg: Mapping[str, Any], model_type: str) -> LongcatLayers | None:
    """LongCat-Flash's layer extras, ``None`` for any other family."""
    if model_type not in LONGCAT_TYPES:
        return None
    return LongcatLayers(zero_experts=first_int(cfg, "zero_expert_num") or 0)
