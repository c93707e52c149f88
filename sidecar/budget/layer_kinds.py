"""How each decoder layer of a model holds KV, read from its config per family. Pure.

One :class:`LayerKind` per layer: full attention, a sliding window, Llama 4's chunked local attention, a
fixed-size recurrent state, or nothing. The rules, each as vLLM 0.32.0 builds the family's layers (the
transformers 5.19 config classes supply what a published config omits):

* ``layer_types`` / ``layers_block_type`` lists, where a config has one: ``full_attention``/``attention``
  attend, ``sliding_attention`` in a window, ``chunked_attention`` in chunks; ``linear_attention`` (Qwen3.5's
  and OLMo-Hybrid's gated DeltaNet), ``mamba`` (Granite-4.0-H, Zamba2) and ``conv`` (LFM2's short
  convolutions: ``lfm2.py``, ``is_attn = layer_types[i] == "full_attention"``) keep a state. Zamba2's
  ``hybrid`` layers (``zamba2.py``: a Mamba2 layer after the shared attention block) attend, and so do the
  ``indexed_attention`` layers transformers 5 lists for DeepSeek-V3.2 and GLM-5 (MLA over every token; the
  indexer's own cache is named in a note, :mod:`sidecar.budget.unmodelled`). A type no rule knows is planned
  as full attention, the most KV a layer holds, and a note names it (it used to hold nothing).
* Nemotron-H's ``hybrid_override_pattern`` (``*`` attends, ``M`` is Mamba2); Qwen3-Next's
  ``full_attention_interval`` (every n-th layer attends, the rest are DeltaNet).
* Jamba: ``layers_block_type`` is a property of ``JambaConfig``, not a field: layer ``i`` attends when
  ``i % attn_layer_period == attn_layer_offset`` (``configuration_jamba.py``; ``jamba.py`` builds
  ``ALL_DECODER_LAYER_TYPES[config.layers_block_type[i]]``).
* Kimi Linear: ``linear_attn_config.kda_layers`` lists the (1-based) KDA layers, the rest attend
  (``KimiLinearConfig.is_kda_layer``, ``vllm/transformers_utils/configs/kimi_linear.py``).
* Bailing V3 (``bailing_hybrid``): the last layer of each ``layer_group_size`` group and any left over attend,
  the rest are KDA, whatever ``layer_types`` says (``_is_kda_layer``, ``bailing_moe_v3.py``, vLLM 0.32.0).
* Step 3.5: ``layer_types`` padded with the MTP layers' entries is cut to the model (``Step3p5Config``).
* Falcon-H1 attends in every layer and runs a Mamba2 mixer beside it (:func:`parallel_state_layers`).
* Sliding windows: Qwen2-family windows only with ``use_sliding_window`` (from ``max_window_layers`` on);
  Gemma 2 alternates, Gemma 3 windows five layers of six; any other model with a ``sliding_window`` and
  no list windows every layer (Mistral v0.1, Mixtral, Starcoder2).

Llama 4 (``llama4_text``): layer ``i`` uses RoPE unless ``no_rope_layers[i]`` is 0, and when that list is
empty or absent every fourth layer is NoPE (``Llama4TextConfig.__post_init__``,
``transformers/models/llama4/configuration_llama4.py``, 5.19). vLLM 0.32.0 gives the RoPE layers chunked
local attention over ``attention_chunk_size`` tokens (default 8192) and the NoPE layers full attention
(``Llama4Attention.__init__``, ``vllm/model_executor/models/llama4.py``: ``ChunkedLocalAttention`` when
``not self.nope and config.attention_chunk_size``), hence :attr:`LayerKind.CHUNKED`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from sidecar.budget.config_fields import first_int
from sidecar.budget.gemma4 import GEMMA4_TYPES
from sidecar.budget.mimo import MIMO_TYPES, hybrid_pattern
from sidecar.budget.moe import LLAMA4_TYPES
from sidecar.budget.step3p5 import STEP3P5_TYPES
from sidecar.budget.zamba2 import ZAMBA2, hybrid_layer_count

_QWEN_WINDOW_TYPES = frozenset(
    {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"}
)  # use_sliding_window decides (off in every published checkpoint); windows from max_window_layers on
_GEMMA3_TYPES = frozenset({"gemma3", "gemma3_text"})
GEMMA4_PATTERN = 6
"""Gemma 4's window pattern, fixed in ``Gemma4TextConfig.__post_init__`` (the config is not read)."""
_DEFAULT_GEMMA3_PATTERN = 6
_LLAMA4_NO_ROPE_INTERVAL = 4  # Llama4TextConfig.no_rope_layer_interval's default
_LLAMA4_CHUNK_DEFAULT = 8192  # Llama4TextConfig.attention_chunk_size's default
PARALLEL_STATE_TYPES = frozenset({"falcon_h1"})
"""Families whose every layer runs a state mixer beside its attention (``FalconH1ParallelHybrid``)."""


class LayerKind(StrEnum):
    """How one decoder layer holds KV: all tokens, a window of them, the current chunk, a state, or none."""

    FULL = "full"
    SLIDING = "sliding"
    CHUNKED = "chunked"  # Llama 4's chunked local attention (vLLM's ChunkedLocalAttentionSpec)
    STATE = "state"  # a fixed-size recurrent state per sequence (sidecar.budget.state_layers)
    NONE = "none"

    @property
    def attends(self) -> bool:
        """Whether the layer keeps KV per token (full, sliding or chunked attention)."""
        return self in (LayerKind.FULL, LayerKind.SLIDING, LayerKind.CHUNKED)


def vllm_is_hybrid(kinds: tuple[LayerKind, ...]) -> bool:
    """Whether vLLM calls a model with these layers hybrid: state layers among them (its ``is_hybrid``).

    ``kinds`` is ``Architecture.kv_kinds``; it gates TurboQuant's boundary layers and V2's default runner.
    """
    return LayerKind.STATE in kinds


_LISTED_KINDS = {
    "full_attention": LayerKind.FULL,
    "attention": LayerKind.FULL,  # Granite-4.0-H, Jamba
    "hybrid": LayerKind.FULL,  # Zamba2: the shared attention block, then a Mamba2 layer
    "sliding_attention": LayerKind.SLIDING,
    "chunked_attention": LayerKind.CHUNKED,
    "indexed_attention": LayerKind.FULL,  # DeepSeek-V3.2, GLM-5 (transformers 5): MLA KV for every token
    "linear_attention": LayerKind.STATE,  # Qwen3.5's and OLMo-Hybrid's gated DeltaNet
    "mamba": LayerKind.STATE,
    "conv": LayerKind.STATE,  # LFM2's short convolution
    "mlp": LayerKind.NONE,  # Nemotron-H as transformers 5 lists it: a layer that is an MLP alone
    "moe": LayerKind.NONE,  # ... or its experts alone
}


def attention_chunk_size(cfg: Mapping[str, Any], model_type: str) -> int | None:
    """Llama 4's ``attention_chunk_size`` (transformers' default when absent; ``null`` turns it off)."""
    if model_type not in LLAMA4_TYPES:
        return None
    return first_int(cfg, "attention_chunk_size") if "attention_chunk_size" in cfg else _LLAMA4_CHUNK_DEFAULT


def parallel_state_layers(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> int:
    """State mixers that run beside attention in the same layers, else 0.

    Falcon-H1: one in every layer; Zamba2: one in each ``hybrid`` layer, after its shared attention block
    (:mod:`sidecar.budget.zamba2`).
    """
    if model_type == ZAMBA2:
        return hybrid_layer_count(cfg)
    return num_layers if model_type in PARALLEL_STATE_TYPES else 0


def _llama4_layer_kinds(cfg: Mapping[str, Any], num_layers: int, chunk: int | None) -> tuple[LayerKind, ...]:
    """RoPE layers attend within their chunk, NoPE layers to every token (see the module docstring)."""
    rope = cfg.get("no_rope_layers")
    if not (isinstance(rope, list) and len(rope) == num_layers):  # transformers: [] or absent -> the default
        rope = [(i + 1) % _LLAMA4_NO_ROPE_INTERVAL != 0 for i in range(num_layers)]
    return tuple(LayerKind.CHUNKED if chunk and uses_rope else LayerKind.FULL for uses_rope in rope)


def unlisted_layer_types(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """The layer types a config lists that no rule here knows (each is planned as full attention)."""
    layer_types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if not isinstance(layer_types, list):
        return ()
    return tuple(sorted({str(t) for t in layer_types} - set(_LISTED_KINDS)))


def _declared_kinds(  # noqa: PLR0911 - one return per family rule reads best
    cfg: Mapping[str, Any], model_type: str, num_layers: int
) -> tuple[LayerKind, ...] | None:
    """Kinds a config declares layer by layer (lists, patterns, periods), ``None`` when it declares none."""
    group = first_int(cfg, "layer_group_size")  # Bailing V3: vLLM's _is_kda_layer (bailing_moe_v3.py)
    if model_type == "bailing_hybrid" and group:  # attends each group's last layer; layer_types unread
        last = num_layers // group * group
        return tuple(
            LayerKind.FULL if (i + 1) % group == 0 or i >= last else LayerKind.STATE
            for i in range(num_layers)
        )
    layer_types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if model_type in STEP3P5_TYPES and isinstance(layer_types, list):  # MTP layers' entries padded on
        layer_types = layer_types[:num_layers]  # vLLM 0.32.0's Step3p5Config keeps the model's
    if isinstance(layer_types, list) and len(layer_types) == num_layers:
        return tuple(_LISTED_KINDS.get(str(t), LayerKind.FULL) for t in layer_types)
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) == num_layers:  # Nemotron-H: "*" attends, "M" is Mamba2
        return tuple({"*": LayerKind.FULL, "M": LayerKind.STATE}.get(c, LayerKind.NONE) for c in pattern)
    interval = first_int(cfg, "full_attention_interval")
    if interval and model_type == "qwen3_next":  # every interval-th layer attends; the rest are DeltaNet
        return tuple(LayerKind.STATE if (i + 1) % interval else LayerKind.FULL for i in range(num_layers))
    period, offset = first_int(cfg, "attn_layer_period"), first_int(cfg, "attn_layer_offset")
    if model_type == "jamba" and period and offset is not None:  # JambaConfig's defaults fill them (8, 4)
        return tuple(LayerKind.FULL if i % period == offset else LayerKind.STATE for i in range(num_layers))
    sliding = hybrid_pattern(cfg, num_layers) if model_type in MIMO_TYPES else None
    if sliding is not None:  # MiMo-V2: hybrid_layer_pattern, 1 for a sliding layer (sidecar.budget.mimo)
        return tuple(LayerKind.SLIDING if slides else LayerKind.FULL for slides in sliding)
    linear = cfg.get("linear_attn_config")
    if isinstance(linear, Mapping) and isinstance(linear.get("kda_layers"), list):  # Kimi Linear, 1-based
        kda = {n for n in linear["kda_layers"] if isinstance(n, int)}
        return tuple(LayerKind.STATE if i + 1 in kda else LayerKind.FULL for i in range(num_layers))
    return None


def layer_kinds(  # noqa: PLR0911 - one return per family rule reads best
    cfg: Mapping[str, Any], model_type: str, num_layers: int
) -> tuple[LayerKind, ...]:
    """Each decoder layer's kind, by the family rules of the module docstring."""
    if model_type in LLAMA4_TYPES:
        return _llama4_layer_kinds(cfg, num_layers, attention_chunk_size(cfg, model_type))
    declared = _declared_kinds(cfg, model_type, num_layers)
    if model_type in GEMMA4_TYPES:  # Gemma4TextConfig.__post_init__: 5:1 unless listed, the last layer full
        listed = declared or tuple(
            LayerKind.SLIDING if (i + 1) % GEMMA4_PATTERN else LayerKind.FULL for i in range(num_layers)
        )
        return (*listed[:-1], LayerKind.FULL)
    if declared is not None:
        return declared
    window = first_int(cfg, "sliding_window")
    if window is None:
        return (LayerKind.FULL,) * num_layers
    if model_type in _QWEN_WINDOW_TYPES:
        if not cfg.get("use_sliding_window", False):
            return (LayerKind.FULL,) * num_layers
        first_windowed = first_int(cfg, "max_window_layers") or 0
        return tuple(LayerKind.SLIDING if i >= first_windowed else LayerKind.FULL for i in range(num_layers))
    if model_type == "gemma2":  # even layers local, odd layers global
        return tuple(LayerKind.SLIDING if (i + 1) % 2 else LayerKind.FULL for i in range(num_layers))
    if model_type in _GEMMA3_TYPES:
        pattern = first_int(cfg, "sliding_window_pattern") or _DEFAULT_GEMMA3_PATTERN
        return tuple(LayerKind.SLIDING if (i + 1) % pattern else LayerKind.FULL for i in range(num_layers))
    return (LayerKind.SLIDING,) * num_layers  # Mistral v0.1, Mixtral, Starcoder2: every layer windowed
