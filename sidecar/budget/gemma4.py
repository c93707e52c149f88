"""Gemma 4's layers as transformers 5.19 and vLLM 0.32.0 build them: what sets it apart from Gemma 3. Pure.

Read in transformers 5.19 (``models/gemma4/configuration_gemma4.py``, ``Gemma4TextConfig.__post_init__``;
``modeling_gemma4.py``, ``Gemma4TextAttention``, ``Gemma4TextMLP``, ``Gemma4TextDecoderLayer``,
``Gemma4TextRouter``, ``Gemma4TextExperts``, ``Gemma4TextModel``) and vLLM 0.32.0 as installed
(``vllm/model_executor/models/gemma4.py``, ``Gemma4Attention``, ``Gemma4DecoderLayer``), which reads the same
``per_layer_config``:

* **Full-attention layers have a geometry of their own.** A published config gives ``global_head_dim``
  (512 when absent) and ``num_global_key_value_heads``; transformers folds them into ``per_layer_config``
  (``{layer: {"head_dim": ..., "num_key_value_heads": ...}}`` for each full-attention layer) and a config it
  saves carries that instead. The KV-head override applies only with ``attention_k_eq_v`` (transformers'
  rule, kept as written). With ``attention_k_eq_v`` a full-attention layer has no ``v_proj``: its keys are
  its values, but vLLM still caches both (the K weights load into both slots), so the KV per token is
  unchanged.
* **The last ``num_kv_shared_layers`` layers keep no KV of their own** (Gemma 3n too): they read the cache of
  the last earlier layer of their kind (``kv_sharing_target_layer_name``), and vLLM gives them no KV cache
  spec (``GPUModelRunner.get_kv_cache_spec``: "doesn't allocate KV cache for the layer"). They have no
  ``k_proj``, ``v_proj`` or norms for them, and with ``use_double_wide_mlp`` an MLP twice as wide.
* **Per-layer input embeddings** (``hidden_size_per_layer_input`` > 0): one table of
  ``vocab_size_per_layer_input x (layers x hidden_size_per_layer_input)``, a projection from the hidden
  state to the same width and its norm, and per layer a gate, a projection back and a norm.
* **The MoE block** (``enable_moe_block``, Gemma 4 26B-A4B) runs beside each layer's dense MLP: a router
  (a projection to ``num_experts``, a scale per hidden unit and per expert), ``num_experts`` gated experts of
  ``moe_intermediate_size``, ``top_k_experts`` of them per token, and three more norms (its experts are a
  :class:`sidecar.budget.moe.MoeSpec`, the dense MLP its shared expert).

* **Its towers** (``Gemma4VisionModel``, ``Gemma4AudioModel`` and a ``Gemma4MultimodalEmbedder`` each;
  vLLM 0.32.0's ``gemma4_mm.py`` builds the audio tower with transformers' own class): the vision tower's
  two-axis position table of ``position_embedding_size`` and patch projection ``3 x patch^2 -> hidden``
  without bias, layers of q/k/v/o projections (KV heads of ``num_key_value_heads``), q and k norms of the
  head size, a gated MLP and four RMSNorms; with an ``audio_config`` (E2B, E4B; none builds no audio tower)
  the audio tower's subsampling (two 3 x 3 convolutions without bias, each with a LayerNorm weight, and a
  projection from ``channels[0] // 4 x channels[1]``), conformer layers of two feed-forwards (a norm before
  and after, two linears of four times the width), an attention (q/k/v, relative keys and the output
  projection without bias, a per-dimension scale), a light convolution (a gated linear, a depthwise kernel,
  a linear, two norms) and three more norms, and ``output_proj`` with a bias to ``output_proj_dims``; each
  embedder is one projection to the text width (its norm has no weight). The audio linears' clipping bounds
  (``use_clipped_linears``) are buffers, not parameters.

Full-attention layers with a page larger or smaller than the sliding layers' make vLLM scale the smaller
page's block size (:class:`sidecar.budget.kv_terms.KvPages`).

Gemma 4 Unified (``gemma4_unified``) is the same text model: vLLM 0.32.0 builds it with ``Gemma4ForCausalLM``
(``gemma4_unified.py``), and transformers 5.19's ``Gemma4UnifiedTextConfig`` saves ``per_layer_config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.budget.config_fields import first_int
from sidecar.budget.config_fields import int_field as _int

GEMMA4_TYPES: Final = frozenset({"gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text"})
KV_SHARING_TYPES: Final = GEMMA4_TYPES | frozenset({"gemma3n", "gemma3n_text"})
GLOBAL_HEAD_DIM_DEFAULT: Final = 512
"""``Gemma4TextConfig.__post_init__``: ``kwargs.pop("global_head_dim", 512)`` (transformers 5.19)."""


@dataclass(frozen=True, slots=True)
class Gemma4Layers:
    """What a Gemma 4 config adds to the common decoder shape."""

    full_head_dim: int  # the full-attention layers' head size
    full_kv_heads: int  # and their KV heads
    keys_are_values: bool  # attention_k_eq_v: full-attention layers have no v_proj
    per_layer_input_size: int = 0  # hidden_size_per_layer_input (0: no per-layer embeddings)
    per_layer_vocab_size: int = 0  # vocab_size_per_layer_input
    double_wide_shared_mlp: bool = False  # use_double_wide_mlp: KV-shared layers' MLP is twice as wide


def _full_layer_override(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """The first full-attention layer's entry of ``per_layer_config`` as transformers saves it, if any."""
    listed = cfg.get("per_layer_config")
    if isinstance(listed, Mapping):
        for entry in listed.values():
            if isinstance(entry, Mapping):
                return entry
    return {}


def gemma4_layers(
    cfg: Mapping[str, Any], model_type: str, head_dim: int, kv_heads: int
) -> Gemma4Layers | None:
    """Gemma 4's per-layer facts from its (text) config, or ``None`` for another family."""
    if model_type not in GEMMA4_TYPES:
        return None
    keys_are_values = bool(cfg.get("attention_k_eq_v", False))
    saved = _full_layer_override(cfg)
    if saved:  # a config transformers 5.19 saved: the override is written out
        full_head_dim = first_int(saved, "head_dim") or head_dim
        full_kv_heads = first_int(saved, "num_key_value_heads") or kv_heads
    else:
        full_head_dim = first_int(cfg, "global_head_dim") or GLOBAL_HEAD_DIM_DEFAULT
        global_kv = first_int(cfg, "num_global_key_value_heads")
        full_kv_heads = global_kv if global_kv and keys_are_values else kv_heads
    per_layer_input = first_int(cfg, "hidden_size_per_layer_input") or 0
    return Gemma4Layers(
        full_head_dim=full_head_dim,
        full_kv_heads=full_kv_heads,
        keys_are_values=keys_are_values,
        per_layer_input_size=per_layer_input,
        per_layer_vocab_size=(first_int(cfg, "vocab_size_per_layer_input") or 0) if per_layer_input else 0,
        double_wide_shared_mlp=bool(cfg.get("use_double_wide_mlp", False)),
    )


def kv_shared_layers(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> int:
    """How many trailing layers keep no KV of their own (``num_kv_shared_layers``; Gemma 3n and 4)."""
    if model_type not in KV_SHARING_TYPES:
        return 0
    return max(0, min(num_layers - 1, first_int(cfg, "num_kv_shared_layers") or 0))


def attention_parameters(
    spec: Gemma4Layers, hidden: int, heads: int, geometry: tuple[int, int], *, full: bool, shared: bool
) -> int:
    """One Gemma 4 attention block: q (and its norm) and o always; k, v and the k norm unless KV-shared.

    ``geometry`` is the layer's (head size, KV heads); the v norm has no weight.
    """
    head_dim, kv_heads = geometry
    total = 2 * hidden * heads * head_dim + head_dim  # q_proj, o_proj, q_norm
    if shared:
        return total
    projections = 1 if full and spec.keys_are_values else 2  # k_proj (and v_proj)
    return total + projections * hidden * kv_heads * head_dim + head_dim  # ... and k_norm


def per_layer_input_parameters(spec: Gemma4Layers, hidden: int, num_layers: int) -> int:
    """Parameters of the per-layer input embeddings (table, projections, norms), 0 without them."""
    width = spec.per_layer_input_size
    if not width:
        return 0
    table = spec.per_layer_vocab_size * num_layers * width
    model_projection = hidden * num_layers * width + width
    return table + model_projection + num_layers * (2 * hidden * width + hidden)


def moe_block_extras(num_experts: int, hidden: int) -> int:
    """A Gemma 4 MoE layer's router scales and three norms (beyond experts, router and dense MLP)."""
    return hidden + num_experts + 3 * hidden


def gemma4_towers(config: Mapping[str, Any], text_hidden: int) -> int:
    """Gemma 4's vision tower and, with an ``audio_config``, its audio tower, each with its embedder."""
    vision, audio = config.get("vision_config"), config.get("audio_config")
    total = _vision_tower(vision, text_hidden) if isinstance(vision, Mapping) else 0
    return total + (_audio_tower(audio, text_hidden) if isinstance(audio, Mapping) else 0)


def _vision_tower(vision: Mapping[str, Any], text_hidden: int) -> int:
    """The vision tower and its embedder (defaults: ``Gemma4VisionConfig``'s)."""
    width = _int(vision, "hidden_size", default=768)
    inner = _int(vision, "intermediate_size", default=3072)
    heads, head_dim = _int(vision, "num_attention_heads", default=12), _int(vision, "head_dim", default=64)
    kv_heads = _int(vision, "num_key_value_heads", default=heads)
    patch = _int(vision, "patch_size", default=16)
    positions = _int(vision, "position_embedding_size", default=10 * 1024)
    embeddings = 2 * positions * width + 3 * patch * patch * width
    attention = 2 * width * heads * head_dim + 2 * width * kv_heads * head_dim + 2 * head_dim
    layer = attention + 3 * width * inner + 4 * width
    return embeddings + _int(vision, "num_hidden_layers", default=16) * layer + text_hidden * width


def _audio_tower(audio: Mapping[str, Any], text_hidden: int) -> int:
    """The audio tower and its embedder (defaults: ``Gemma4AudioConfig``'s, which E2B and E4B publish)."""
    width, heads = _int(audio, "hidden_size", default=1024), _int(audio, "num_attention_heads", default=8)
    out, kernel = _int(audio, "output_proj_dims", default=1536), _int(audio, "conv_kernel_size", default=5)
    channels = audio.get("subsampling_conv_channels")
    first, second = 128, 32
    if isinstance(channels, list) and len(channels) >= 2 and all(isinstance(c, int) for c in channels[:2]):
        first, second = channels[0], channels[1]
    subsampling = 9 * first + first + 9 * first * second + second + (first // 4) * second * width
    inner = heads * (width // heads)
    feed_forward = 8 * width * width + 2 * width  # two linears of 4 x width, a norm before and after
    attention = 4 * width * inner + width * width + width // heads  # q, k, v, relative k; post; scale
    convolution = 3 * width * width + kernel * width + 2 * width
    layer = 2 * feed_forward + attention + convolution + 3 * width
    tower = subsampling + _int(audio, "num_hidden_layers", default=12) * layer + width * out + out
    return tower + out * text_hidden
