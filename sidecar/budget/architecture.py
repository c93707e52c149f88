"""A model's shape, read from a Hugging Face ``config.json``: everything the KV arithmetic needs.

:func:`architecture_from_config` is pure (a dict in, an :class:`Architecture` out); :func:`load_architecture`
reads a ``config.json`` file or a model directory, and in a directory also reads the exact parameter count
from the safetensors files when they are there (see :mod:`sidecar.budget.safetensors`).

Field fallbacks follow vLLM: KV heads are the first present of ``n_head_kv``, ``num_kv_heads``,
``num_key_value_heads`` and ``multi_query_group_num``, else the attention heads; the head size is
``head_dim``, else ``hidden_size_per_head``, else ``hidden_size // num_attention_heads``. Multimodal configs
keep the language model under ``text_config``.

Which layers attend, in a window or chunk, or keep a recurrent state: :mod:`sidecar.budget.layer_kinds`. Llama
4's QK norm is ``Llama4TextL2Norm`` (``modeling_llama4.py``; vLLM: ``RMSNorm(..., has_weight=False)``), which
has no weight, so ``qk_norm`` stays off for the parameter count. Its MoE layers: :mod:`sidecar.budget.moe`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from sidecar.budget.config_fields import first_int, read_config_file, with_vllm_names
from sidecar.budget.deepseek_v4 import V4Attention, v4_attention
from sidecar.budget.defaults import transformers_defaults
from sidecar.budget.dtypes import normalise_dtype, serving_dtype
from sidecar.budget.gemma3n import Gemma3nLayers, gemma3n_layers
from sidecar.budget.gemma4 import Gemma4Layers, gemma4_layers, kv_shared_layers
from sidecar.budget.indexer import IndexerSpec, indexer_spec
from sidecar.budget.layer_kinds import LayerKind, attention_chunk_size, layer_kinds, parallel_state_layers
from sidecar.budget.layer_shape import FALCON_TYPES, LLAMA_LAYER, LayerShape, layer_shape
from sidecar.budget.longcat import ATTENTION_BLOCKS, LongcatLayers, longcat_layers
from sidecar.budget.mimo import MimoLayers, sliding_window
from sidecar.budget.moe import TOP_K_FIELDS, MoeSpec, moe_from_config
from sidecar.budget.quantization import checkpoint_quantization, packs_weights, quantization_method
from sidecar.budget.rope import rope_cache_elements
from sidecar.budget.safetensors import TensorFilter, draft_tensor_filter, measured_parameter_count
from sidecar.budget.state_layers import StateSpec, state_spec
from sidecar.budget.step3p5 import attention_geometries
from sidecar.budget.unmodelled import unmodelled_features
from sidecar.budget.vision import vision_parameters
from sidecar.budget.vllm_classes import state_class
from sidecar.budget.zamba2 import ZAMBA2, Zamba2Blocks, zamba2_blocks
from sidecar.errors import ConfigError

__all__ = [  # LayerKind is re-exported: callers knew it from here before it moved to layer_kinds
    "Architecture", "LayerKind", "MlaSpec", "architecture_from_config", "load_architecture",
    "read_config_file",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3): the cache holds one compressed latent per token."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None

    @property
    def latent_size(self) -> int:
        """Elements cached per token per layer: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class Architecture:
    """The parts of a model's configuration that decide its memory footprint."""

    model_type: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    dtype: str
    layer_kinds: tuple[LayerKind, ...]
    sliding_window: int | None = None
    attention_chunk_size: int | None = None  # the span of CHUNKED layers
    max_position_embeddings: int | None = None
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    quantization: str | None = None
    packed_weights: bool = False  # tensors hold several weights an element: headers do not count parameters
    quantization_method: str | None = None  # quantization_config.quant_method as published
    parameter_count: int | None = None
    parameter_source: str = "computed from config.json"
    derived_max_model_len: int | None = None  # the longest --max-model-len vLLM accepts
    rope_cache_elements: int = 0  # vLLM's cos/sin tables on each GPU (sidecar.budget.rope)
    vision_parameters: int | None = 0  # the vision tower and projector (None: a tower not modelled)
    shape: LayerShape = LLAMA_LAYER  # MLP gating, biases, norms: what differs from Llama's layer
    class_name: str | None = None  # ``architectures[0]``: the model class vLLM builds (LoRA rules go by it)
    draft_layers: int = 0  # ``num_nextn_predict_layers``: MTP layers shipped beside the model, not loaded
    rope_key: str = ""  # what vLLM's ``get_rope`` caches a table by: models with the same key share one
    state: StateSpec | None = None  # the STATE layers' shape (sidecar.budget.state_layers)
    parallel_state_layers: int = 0  # state mixers beside attention in the same layers (Falcon-H1)
    unmodelled_state: bool = False  # state layers the plan does not model (by the config or vLLM's registry)
    unmodelled_features: tuple[str, ...] = ()  # what of the config the plan leaves out (a note names them)
    kv_shared_layers: int = 0  # trailing layers that read an earlier layer's KV (Gemma 3n and 4)
    gemma4: Gemma4Layers | None = None  # Gemma 4's full-attention geometry, per-layer inputs, MoE block
    zamba2: Zamba2Blocks | None = None  # Zamba2's shared transformer blocks
    mimo: MimoLayers | None = None  # MiMo-V2's and Step 3.5's sliding and full attention geometries
    indexer: IndexerSpec | None = None  # DeepSeek-V3.2's sparse-attention indexer (its cache and weights)
    longcat: LongcatLayers | None = None  # LongCat-Flash's two attention blocks and two MLPs a layer
    gemma3n: Gemma3nLayers | None = None  # Gemma 3n's AltUp, LAuReL and per-layer inputs
    v4: V4Attention | None = None  # DeepSeek-V4's compressed attention (its own packed KV pool)

    @property
    def kv_kinds(self) -> tuple[LayerKind, ...]:
        """Each layer's kind as the pool sees it (none where KV-shared), then parallel state mixers'."""
        own = len(self.layer_kinds) - self.kv_shared_layers
        shared = (LayerKind.NONE,) * (len(self.layer_kinds) - own)
        return self.layer_kinds[:own] + shared + (LayerKind.STATE,) * self.parallel_state_layers

    def full_attention_geometry(self) -> tuple[int, int]:
        """The full-attention layers' (head size, KV heads): Gemma 4's own, else every layer's."""
        if self.gemma4 is not None:
            return self.gemma4.full_head_dim, self.gemma4.full_kv_heads
        return self.head_dim, self.num_kv_heads

    def full_kv_elements_per_token_per_layer(self, tensor_parallel_size: int) -> int:
        """Cached elements one token adds to one full-attention layer on one GPU."""
        if self.mimo is not None:
            return self.mimo.full.kv_elements(tensor_parallel_size)
        if self.gemma4 is None:
            return self.kv_elements_per_token_per_layer(tensor_parallel_size)
        head_dim, kv_heads = self.full_attention_geometry()
        return 2 * max(1, kv_heads // tensor_parallel_size) * head_dim

    def kv_heads_per_gpu(self, tensor_parallel_size: int) -> int:
        """KV heads one GPU holds: split across tensor-parallel ranks, never below one (MLA: one)."""
        if self.mla is not None:
            return 1
        return max(1, self.num_kv_heads // tensor_parallel_size)

    def kv_elements_per_token_per_layer(self, tensor_parallel_size: int) -> int:
        """Cached elements one token adds to one attention layer on one GPU (K and V, or the MLA latent)."""
        if self.mla is not None:  # LongCat-Flash: two attention blocks a layer, a latent each
            return self.mla.latent_size * (ATTENTION_BLOCKS if self.longcat else 1)
        if self.mimo is not None:  # the sliding layers' (full: full_kv_elements_per_token_per_layer)
            return self.mimo.sliding.kv_elements(tensor_parallel_size)
        return 2 * self.kv_heads_per_gpu(tensor_parallel_size) * self.head_dim

    @property
    def weight_dtype(self) -> str:
        """The dtype the weights are served in: the checkpoint's quantisation, else its serving dtype."""
        return self.quantization or serving_dtype(self.dtype)

    def with_parameter_count(self, count: int, source: str) -> Architecture:
        """A copy whose parameter count was measured (safetensors) rather than computed."""
        return replace(self, parameter_count=count, parameter_source=source)


def _required_int(cfg: Mapping[str, Any], *keys: str) -> int:
    value = first_int(cfg, *keys)
    if value is None or value <= 0:
        raise ConfigError(
            f"config.json lacks a positive {' or '.join(repr(k) for k in keys)}: is it a decoder LLM?"
        )
    return value


def _mla(cfg: Mapping[str, Any]) -> MlaSpec | None:
    rank = first_int(cfg, "kv_lora_rank")
    if rank is None:
        return None
    return MlaSpec(
        kv_lora_rank=rank,
        qk_rope_head_dim=first_int(cfg, "qk_rope_head_dim") or 0,  # GLM-5-Next's MLA: 0, no rotary part
        qk_nope_head_dim=_required_int(cfg, "qk_nope_head_dim"),
        v_head_dim=_required_int(cfg, "v_head_dim"),
        q_lora_rank=first_int(cfg, "q_lora_rank"),
    )


_MAX_LEN_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)  # fmt: skip
_UNSCALED_ROPE = frozenset({"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"})


def _rope_parameters(cfg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, Mapping):
        return []
    if any(k in rope for k in ("rope_type", "type", "factor")):
        return [rope]
    return [v for v in rope.values() if isinstance(v, Mapping)]  # per layer type (transformers 5)


def _derived_max_len(cfg: Mapping[str, Any], model_type: str) -> int | None:
    """VLLM's derived maximum length (``_get_and_verify_max_len``, vllm/config/model.py, 0.32.0).

    The smallest of the length keys present, times the RoPE scaling factor, except for RoPE types whose
    ``max_position_embeddings`` is already scaled (llama3, YaRN, LongRoPE, ...) and for Gemma 3.
    """
    lengths = [
        v for k in _MAX_LEN_KEYS if isinstance(v := cfg.get(k), int | float) and not isinstance(v, bool)
    ]
    if not lengths:
        return None
    factor = 1.0
    if "gemma3" not in model_type:
        for rope in _rope_parameters(cfg):
            kind = str(rope.get("rope_type") or rope.get("type") or "default")
            if kind not in _UNSCALED_ROPE and isinstance(rope.get("factor"), int | float):
                factor = float(rope["factor"])
    return int(min(lengths) * factor)


_KV_HEADS: tuple[str, ...] = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
_KV_HEADS += ("kv_n_heads", "num_attention_groups")  # the latter Step 3.5's (Step3p7TextConfig.attribute_map)
_ALIASES = (
    ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts"),
    TOP_K_FIELDS,
    _KV_HEADS,
    ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    ("num_attention_heads", "n_head", "n_heads"),
    ("hidden_size", "n_embd", "d_model"),
    ("intermediate_size", "ffn_hidden_size", "n_inner"),
    ("head_dim", "hidden_size_per_head"),
    ("vocab_size", "padded_vocab_size"),
    _MAX_LEN_KEYS,
)  # spellings of one field: a default never stands in for a spelling the config uses


def _without_aliases(defaults: Mapping[str, Any], published: Mapping[str, Any]) -> dict[str, Any]:
    dropped = {key for group in _ALIASES if any(k in published for k in group) for key in group}
    return {k: v for k, v in defaults.items() if k not in dropped}


TIE_FIELD: Final = "tie_word_embeddings"
"""Whether the LM head shares the token embeddings: the language model's (text config's) field."""


def _with_defaults(top: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's fields: the config's own, else transformers' defaults for its model types.

    Precedence, lowest first: the text config class's defaults, the top config class's defaults, the
    published top level, the published ``text_config``. ``tie_word_embeddings`` is the language model's own
    (vLLM ties by ``text_config``, which transformers builds from the published ``text_config`` and its class
    alone: a published or default top-level value never reaches it; checked with transformers 5.19's
    ``AutoConfig``), so where a text config class is known its default beats the top level's.
    """
    text = top.get("text_config")
    text = text if isinstance(text, Mapping) else {}
    top_defaults = transformers_defaults(str(top.get("model_type") or ""))
    nested = top_defaults.get("text_config")
    text_type = str(text.get("model_type") or (nested or {}).get("model_type") or "")
    text_defaults = {**(nested or {}), **transformers_defaults(text_type)}
    plain = {k: v for k, v in top_defaults.items() if not isinstance(v, Mapping)}
    if top.get("model_type") == "dbrx":  # DBRX keeps its attention and MLP fields in sub-configs
        nested_fields = [top.get(key) for key in ("attn_config", "ffn_config")]
        text = {**{k: v for sub in nested_fields if isinstance(sub, Mapping) for k, v in sub.items()}, **text}
    defaults = _without_aliases({**text_defaults, **plain}, {**top, **text})
    merged = {**defaults, **top, **text, "model_type": text.get("model_type") or top.get("model_type")}
    if TIE_FIELD not in text and TIE_FIELD in text_defaults and (text or nested):
        merged[TIE_FIELD] = text_defaults[TIE_FIELD]
    return merged


def architecture_from_config(config: Mapping[str, Any]) -> Architecture:
    """Build an :class:`Architecture` from the parsed contents of a ``config.json``."""
    if not isinstance(config, Mapping):
        raise ConfigError("config.json must hold a JSON object")
    top = with_vllm_names(config)  # llm_config: InternVL's original checkpoints
    cfg: Mapping[str, Any] = _with_defaults(top)
    model_type = str(cfg.get("model_type") or top.get("model_type") or "unknown")
    blocks = cfg.get("layers_block_type")  # Nemotron-H as transformers 5 writes it: no num_hidden_layers
    num_layers = len(blocks) if isinstance(blocks, list) and blocks and "num_hidden_layers" not in cfg else 0
    num_layers = num_layers or _required_int(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    if state_class(_class_name(top)) == "attention_free":
        raise ConfigError(
            f"vLLM serves {_class_name(top)} without attention layers (a pure state-space model): "
            "kv-sidecar plans attention KV and does not model it; run the sidecar without a plan"
        )
    heads = _required_int(cfg, "num_attention_heads", "n_head", "n_heads")
    hidden = _required_int(cfg, "hidden_size", "n_embd", "d_model")
    kv_heads = first_int(cfg, *_KV_HEADS) or heads
    falcon = model_type in FALCON_TYPES
    if falcon and not cfg.get("new_decoder_architecture") and cfg.get("multi_query"):
        kv_heads = 1  # vLLM's FalconModelArchConfigConvertor: multi_query means one KV head
    head_dim = first_int(cfg, "head_dim", "hidden_size_per_head") or hidden // heads
    if model_type == ZAMBA2:  # its shared attention block reads [hidden, embeddings]: twice as wide
        head_dim = first_int(cfg, "attention_head_dim") or 2 * hidden // heads
        kv_heads = heads  # vLLM's Zamba2Attention: as many KV heads as query heads
    widths = cfg.get("intermediate_size")
    if isinstance(widths, list) and widths and all(isinstance(w, int) for w in widths):  # Gemma 3n: per layer
        cfg = {**cfg, "intermediate_size": round(sum(widths) / len(widths))}
    intermediate = first_int(cfg, "intermediate_size", "ffn_hidden_size", "n_inner") or 4 * hidden
    if model_type == "lfm2" and cfg.get("block_auto_adjust_ff_dim"):
        intermediate = _lfm2_mlp_width(cfg, intermediate)
    if kv_heads <= 0 or head_dim <= 0:
        raise ConfigError("config.json gives a non-positive KV head count or head size")
    dtype = normalise_dtype(
        str(cfg.get("torch_dtype") or cfg.get("dtype") or top.get("torch_dtype") or "bf16")
    )
    tie = cfg.get(TIE_FIELD, top.get(TIE_FIELD, model_type.startswith("gemma")))
    mla = _mla(cfg)
    max_positions = first_int(cfg, "max_position_embeddings", "n_positions", "seq_length", "max_seq_len")
    rotary = mla.qk_rope_head_dim if mla else head_dim
    state, kinds = state_spec(cfg, model_type), layer_kinds(cfg, model_type, num_layers)
    parallel = parallel_state_layers(cfg, model_type, num_layers)
    # a family with a state spec is modelled even where its config has no state layers (Granite-4.0-Micro)
    hybrid_class = state_class(_class_name(top)) == "hybrid"
    unmodelled = state is None and (parallel > 0 or LayerKind.STATE in kinds or hybrid_class)
    if unmodelled:  # a family whose state layers are not modelled: nothing in the plan (a note says so)
        kinds, parallel = tuple(LayerKind.NONE if kind is LayerKind.STATE else kind for kind in kinds), 0
    return Architecture(
        model_type=model_type,
        num_layers=num_layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=_required_int(cfg, "vocab_size", "padded_vocab_size"),
        tie_word_embeddings=bool(tie),
        dtype=dtype,
        layer_kinds=kinds,
        state=state if LayerKind.STATE in kinds or parallel else None,
        parallel_state_layers=parallel,
        unmodelled_state=unmodelled,
        unmodelled_features=unmodelled_features(cfg, widths, model_type, mla=mla is not None),
        kv_shared_layers=kv_shared_layers(cfg, model_type, num_layers),
        gemma4=gemma4_layers(cfg, model_type, head_dim, kv_heads),
        zamba2=zamba2_blocks(cfg, model_type),
        mimo=attention_geometries(cfg, model_type, heads, kv_heads, head_dim),
        indexer=indexer_spec(cfg, model_type, num_layers),
        longcat=longcat_layers(cfg, model_type),
        gemma3n=gemma3n_layers(cfg, model_type),
        v4=v4_attention(cfg, model_type, num_layers),
        sliding_window=sliding_window(cfg, model_type),
        attention_chunk_size=attention_chunk_size(cfg, model_type),
        max_position_embeddings=max_positions,
        derived_max_model_len=_derived_max_len(cfg, model_type),
        rope_cache_elements=rope_cache_elements(
            cfg, model_type, rotary, max_positions, _rope_parameters(cfg)
        ),
        vision_parameters=vision_parameters(top, hidden),
        shape=layer_shape(cfg, model_type),
        mla=mla,
        moe=moe_from_config(cfg, model_type, intermediate, num_layers),
        quantization=checkpoint_quantization(top),
        packed_weights=packs_weights(top),
        quantization_method=quantization_method(top),
        class_name=_class_name(top),
        draft_layers=first_int(cfg, "num_nextn_predict_layers", "num_mtp_modules") or 0,  # MiniMax-M3: latter
        rope_key=json.dumps(
            [head_dim, rotary, max_positions, cfg.get("rope_theta"), _rope_parameters(cfg)], sort_keys=True
        ),
    )


def _lfm2_mlp_width(cfg: Mapping[str, Any], intermediate: int) -> int:
    """LFM2's MLP width: ``Lfm2MLP`` in transformers 5.19 and vLLM 0.32 alike.

    Two thirds of ``intermediate_size``, scaled by ``block_ffn_dim_multiplier`` and rounded up to
    ``block_multiple_of``.
    """
    width = int(2 * intermediate / 3)
    multiplier = cfg.get("block_ffn_dim_multiplier")
    if isinstance(multiplier, int | float) and not isinstance(multiplier, bool):
        step = first_int(cfg, "block_multiple_of") or 1
        width = step * -(-int(multiplier * width) // step)
    return width


def _class_name(top: Mapping[str, Any]) -> str | None:
    names = top.get("architectures")
    return names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None


def unloaded_tensors(arch: Architecture) -> TensorFilter:
    """The checkpoint tensors vLLM does not put on the GPU: draft layers, DeepSeek-V4.1's n-gram tables."""
    host_tables = arch.v4 is not None and bool(arch.v4.engram_rows)
    return draft_tensor_filter(arch.num_layers, arch.draft_layers, host_tables=host_tables)


def load_architecture(path: Path) -> Architecture:
    """Load the architecture from a ``config.json`` file or a model directory that holds one."""
    config_path = path / "config.json" if path.is_dir() else path
    if path.is_dir() and not config_path.is_file():
        raise ConfigError(
            f"{path} has no config.json: point --model at a model directory or a config.json file"
        )
    arch = architecture_from_config(read_config_file(config_path))
    if path.is_dir() and not arch.packed_weights:  # packed 4-bit elements are not parameters: computed
        measured = measured_parameter_count(path, arch.dtype, unloaded_tensors(arch))
        if measured is not None:
            arch = arch.with_parameter_count(*measured)
    return arch
