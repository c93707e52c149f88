"""DeepSeek-V3.2's sparse-attention indexer (DSA) as vLLM 0.32.0 builds it: its own cache and weights. Pure.

Read in vLLM 0.32.0 as installed (``vllm/models/deepseek_v32/attention.py``: ``DeepseekV32Attention``,
``DeepseekV32Indexer``; ``vllm/model_executor/models/deepseek_v2.py``: ``DeepseekV32IndexerCache``;
``vllm/v1/kv_cache_interface.py``: ``UniformTypeKVCacheSpecs``), for the models with ``index_topk`` in their
config that vLLM builds there (``DeepseekV32ForCausalLM``, GLM-5's ``GlmMoeDsaForCausalLM``):

* **Which layers.** Every layer has an indexer unless ``index_topk_pattern`` marks it ``S``, or, without a
  pattern, ``max(i - index_skip_topk_offset + 1, 0) % index_topk_freq != 0`` (defaults 2 and 1: every layer).
* **Its cache**: one vector a token of ``index_head_dim`` FP8 values and a float32 scale per 128 of them
  (``head_dim + head_dim // 128 * 4`` bytes, ``torch.uint8``; DeepSeek-V3.2: 132 bytes), whatever
  ``--kv-cache-dtype`` says, replicated on every GPU like MLA's latent (``max_tp_shards=1``). It is full
  attention like the layer's MLA cache, so both sit in one group (``UniformTypeKVCacheSpecs``) whose page is
  their sum: a token costs the latent plus 132 bytes in each indexed layer.
* **Its weights**, whole on every GPU (``ReplicatedLinear``, ``disable_tp``): ``wq_b`` (``q_lora_rank`` to
  ``index_n_heads x index_head_dim``, in the checkpoint's quantisation), ``wk_weights_proj`` (hidden to
  ``index_head_dim + index_n_heads``, kept 16-bit: ``quant_config=None``) and a float32 LayerNorm of
  ``index_head_dim`` with its bias.

GLM-5-Next and Hunyuan v4 share indexers between layers (``indexer_types``) in modules of their own; the plan
names their indexer in a note instead (:mod:`sidecar.budget.unmodelled`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.budget.config_fields import first_int

INDEXED_TYPES: Final = frozenset({"deepseek_v32", "glm_moe_dsa"})
_QUANT_BLOCK = 128  # values per float32 scale in the indexer's FP8 cache
_SCALE_BYTES = 4
_SIXTEEN_BIT = 2
_FLOAT32 = 4


@dataclass(frozen=True, slots=True)
class IndexerSpec:
    """The indexer of each indexed layer (see the module docstring)."""

    heads: int  # index_n_heads
    head_dim: int  # index_head_dim
    q_lora_rank: int
    layers: frozenset[int]  # the decoder layers that have one

    @property
    def cache_bytes_per_token(self) -> int:
        """Bytes one token adds to one indexed layer's cache, on every GPU."""
        return self.head_dim + self.head_dim // _QUANT_BLOCK * _SCALE_BYTES

    def quantisable_parameters(self) -> int:
        """``wq_b``'s parameters: the part in the checkpoint's quantisation."""
        return self.q_lora_rank * self.heads * self.head_dim

    def parameters(self, hidden: int) -> int:
        """One indexer's parameters: ``wq_b``, ``wk_weights_proj`` and the LayerNorm."""
        return self.quantisable_parameters() + hidden * (self.head_dim + self.heads) + 2 * self.head_dim

    def bytes_per_gpu(self, hidden: int, quantised_element: float) -> float:
        """One indexer's weights on every GPU: ``wq_b`` at ``quantised_element`` bytes, the rest as loaded."""
        sixteen_bit = hidden * (self.head_dim + self.heads) * _SIXTEEN_BIT
        return self.quantisable_parameters() * quantised_element + sixteen_bit + 2 * self.head_dim * _FLOAT32


def indexer_spec(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> IndexerSpec | None:
    """The indexer of a DSA model ``cfg`` describes (defaults filled in), ``None`` for any other."""
    if model_type not in INDEXED_TYPES or first_int(cfg, "index_topk") is None:
        return None
    pattern = cfg.get("index_topk_pattern")
    if isinstance(pattern, list | str) and pattern:
        layers = frozenset(i for i in range(num_layers) if i >= len(pattern) or pattern[i] != "S")
    else:
        frequency = first_int(cfg, "index_topk_freq") or 1
        offset = first_int(cfg, "index_skip_topk_offset")
        offset = 2 if offset is None else offset
        layers = frozenset(i for i in range(num_layers) if max(i - offset + 1, 0) % frequency == 0)
    heads, head_dim = first_int(cfg, "index_n_heads"), first_int(cfg, "index_head_dim")
    if not heads or not head_dim:  # transformers' defaults fill both for the types above
        return None
    return IndexerSpec(heads, head_dim, first_int(cfg, "q_lora_rank") or 0, layers)
