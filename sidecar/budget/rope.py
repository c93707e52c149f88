"""The rotary embedding's cos/sin table vLLM keeps on every GPU: positions x rotary dimension. Pure.

vLLM's ``RotaryEmbeddingBase.__init__`` (``vllm/model_executor/layers/rotary_embedding/base.py``, 0.32.0)
computes ``cos_sin_cache``, one row of ``rotary_dim`` values (the cos and sin halves) per position, and
registers it as a buffer in the dtype ``get_rope`` is given (the model's, unless the model passes another:
``gpt_oss.py`` passes float32). It is built on the GPU with the model, so "Model loading took" counts it,
and it is not sharded: every tensor-parallel rank and pipeline stage holds all of it. ``get_rope``
(``rotary_embedding/__init__.py``) shares one instance between the layers whose arguments agree, so a model
holds one table per distinct RoPE configuration (Gemma 3: two, its local and global bases).

The positions are the ``max_position`` the model passes (``config.max_position_embeddings`` in the Llama,
Qwen, Mistral, Gemma, Phi and Llama 4 modules), except that YaRN (``YaRNScalingRotaryEmbedding``,
``DeepseekScalingRotaryEmbedding``) tabulates ``original_max_position_embeddings x factor`` and linear
scaling (``LinearScalingRotaryEmbedding``) ``max_position x factor``. The rotary dimension is the head size
times ``partial_rotary_factor`` (MLA: ``qk_rope_head_dim``).

Most tables are small (Llama-3.1-8B: 131,072 x 128 x 2 B = 32 MiB, which its "Model loading took" shows
at TP 1, 2 and 4 alike), but Llama 4's ``max_position_embeddings`` of 10,485,760 makes Scout's 2.5 GiB on
each GPU: the gap between its parameters and the 53.12 GiB its TP 4 log loads.

DeepSeek-V4 (``build_deepseek_v4_rope``, ``vllm/models/deepseek_v4/common/rope.py``, 0.32.0) rotates
``qk_rope_head_dim`` values with ``DeepseekV4ScalingRotaryEmbedding``, whose table is float32: one for its
window-only layers (``max_position_embeddings`` positions, YaRN factor 1) and one for its compressed layers
(YaRN's ``original_max_position_embeddings x factor`` from the ``compress`` or the flat parameters, or
``max_position_embeddings`` when they name no scaling). DeepSeek-V4-Flash: two tables of 1,048,576 x 64,
0.5 GiB on every GPU. DeepSeek-V4.1 (``vllm/models/deepseek_v41/common/rope.py``) the same, its ratio-1 and 2
layers being the compressed ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from sidecar.budget.config_fields import as_number, first_int
from sidecar.budget.deepseek_v4 import V4_TYPES, V41_TYPES, v4_attention

NO_ROPE_TYPES: Final = frozenset({"gpt2", "gpt_bigcode", "opt", "bloom", "mpt"})
"""Families with learned or ALiBi positions (Falcon too when ``alibi`` is set): no table."""
FLOAT32_ROPE_TYPES: Final = frozenset({"gpt_oss"}) | V4_TYPES | V41_TYPES
"""Families whose vLLM module asks ``get_rope`` for a float32 table (DeepSeek-V4: its rotary class does)."""
_TWO_TABLE_TYPES: Final = frozenset({"gemma3", "gemma3_text"})


def _positions(rope: Mapping[str, Any] | None, max_positions: int) -> int:
    if rope is None:
        return max_positions
    kind = str(rope.get("rope_type") or rope.get("type") or "default")
    factor = as_number(rope.get("factor"))
    original = as_number(rope.get("original_max_position_embeddings"))
    if kind in {"yarn", "deepseek_yarn"} and factor and original:
        return int(original * factor)
    if kind == "linear" and factor:
        return int(max_positions * factor)
    return max_positions


def rope_cache_elements(
    cfg: Mapping[str, Any],
    model_type: str,
    rotary_dim: int,
    max_positions: int | None,
    ropes: Sequence[Mapping[str, Any]],
) -> int:
    """Elements of the cos/sin tables one GPU holds (0 without RoPE or a known length).

    ``rotary_dim`` is the full head size (or MLA's RoPE part); ``ropes`` the config's RoPE parameter sets
    (one, or one per layer type).
    """
    if model_type in NO_ROPE_TYPES or cfg.get("alibi") or not max_positions:
        return 0
    if model_type in V4_TYPES | V41_TYPES:
        return _deepseek_v4_elements(cfg, model_type, max_positions, ropes)
    if isinstance(cfg.get("rotary_dim"), int):  # GPT-J
        dim = int(cfg["rotary_dim"])
    else:
        nested = [as_number(rope.get("partial_rotary_factor")) for rope in ropes]
        factor = as_number(cfg.get("partial_rotary_factor")) or next(filter(None, nested), None)
        factor = factor or as_number(cfg.get("rotary_pct")) or 1.0  # GPT-NeoX: rotary_pct
        dim = int(rotary_dim * factor)
    tables = [_positions(rope, max_positions) for rope in ropes] or [max_positions]
    if model_type in _TWO_TABLE_TYPES and len(tables) == 1:
        tables.append(max_positions)  # the local layers' table (rope_local_base_freq), unscaled
    return sum(tables) * dim


def _deepseek_v4_elements(
    cfg: Mapping[str, Any], model_type: str, max_positions: int, ropes: Sequence[Mapping[str, Any]]
) -> int:
    """DeepSeek-V4's tables (see the module docstring): the window-only layers' and the compressed layers'."""
    attention = v4_attention(cfg, model_type, first_int(cfg, "num_hidden_layers") or 0)
    least = 0 if attention is not None and attention.v41 else 1  # V4.1's ratio 1 compresses; V4's is a window
    compressed = {ratio > least for ratio in attention.ratios} if attention else set()
    nested = cfg.get("rope_parameters")
    compress = nested.get("compress") if isinstance(nested, Mapping) else None
    scaled = compress if isinstance(compress, Mapping) else (ropes[0] if ropes else None)
    tables = [max_positions] if False in compressed else []  # the window-only layers' (YaRN factor 1)
    if True in compressed:
        tables.append(_positions(scaled, max_positions))
    dim = cfg.get("qk_rope_head_dim")
    return sum(tables) * (dim if isinstance(dim, int) else 64)
