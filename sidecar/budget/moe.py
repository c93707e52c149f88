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

Kimi Linear and Kimi K3 (vLLM 0.32.0 ``vllm/models/kimi_k3/nvidia/model.py``, ``KimiMoE``) count their
experts per token in ``num_experts_per_token``; with tensor parallelism and no expert parallelism each GPU's
share of an expert's width is padded up to ``min_moe_intermediate_per_partition`` (256): Kimi-Linear's 1,024
wide experts take twice their share at TP 8. K3's routed experts run at ``routed_expert_hidden_size`` (a
latent width), between a down and an up projection (and a norm with ``latent_moe_use_norm``) that every GPU
holds whole.

Step 3 and Step 3.5 list their MoE layers in ``moe_layers_enum`` and give each one shared expert of
``share_expert_dim`` (:mod:`sidecar.budget.step3p5`).

ERNIE 4.5's MoE (``ernie4_5_moe``) names its fields apart: ``moe_num_experts``, ``moe_k``,
``moe_num_shared_experts`` (one shared MLP of that many times ``moe_intermediate_size``), and makes a layer a
MoE layer when ``(i + 1) % moe_layer_interval == 0`` and ``moe_layer_start_index <= i <=
moe_layer_end_index`` (transformers 5.19 ``Ernie4_5_MoeDecoderLayer``; vLLM 0.32.0 ``ernie45_moe.py``,
``Ernie4_5_MoeDecoderLayer``, the end defaulting to the last layer): ERNIE-4.5-21B-A3B's first layer is dense.
AFMoE, EXAONE-MoE and HunYuan v3 count their shared experts in ``num_shared_experts``; LongCat-Flash's experts
are ``expert_ffn_hidden_size`` wide; DBRX names its ``moe_top_k`` (in ``ffn_config``).

A config that lists its layers' MLPs (``mlp_layer_types``, which transformers 5 derives from the fields above
and writes beside them: ``dense``, ``sparse``; DeepSeek-V4's ``moe`` and ``hash_moe``) is read by that list;
MiMo-V2 marks its expert layers in ``moe_layer_freq``. ERNIE 4.5 VL's text model has only the list, and
gives each modality's experts their own width (``moe_intermediate_size: [1536, 512]``, as many experts of
each): their parameters are counted as experts of the widths summed (the shared experts are of the text
width), so the profile's active experts are the text and image ones together, a little wider than either.

HunYuan v1 MoE (``hunyuan_v1_moe``, Hunyuan-A13B) is served by vLLM 0.32.0 through its Transformers backend
(``TransformersMoEForCausalLM``, ``registry.py``), so transformers 5.19's modelling is the engine's: every
layer holds ``num_experts`` experts of ``intermediate_size`` (even one), a router and one ``shared_mlp`` of
``intermediate_size``; ``moe_topk`` and ``moe_intermediate_size`` may be lists, one entry per layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from sidecar.budget.config_fields import first_int
from sidecar.budget.gemma4 import GEMMA4_TYPES
from sidecar.budget.mimo import MIMO_TYPES, moe_layer_freq
from sidecar.budget.step3p5 import STEP_MOE_TYPES, step3p5_moe_layers, step3p5_shared_width

LLAMA4_TYPES: Final = frozenset({"llama4", "llama4_text"})
_SHARED_GATE_TYPES = frozenset({"qwen2_moe", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text"})
ERNIE_MOE_TYPES: Final = frozenset({"ernie4_5_moe"})
ERNIE_VL_TYPES: Final = frozenset({"ernie4_5_vl_moe", "ernie4_5_vl_moe_text"})
HUNYUAN_MOE_TYPES: Final = frozenset({"hunyuan_v1_moe"})
_PER_LAYER = frozenset({"moe_topk", "num_experts", "moe_intermediate_size", "num_shared_expert", "moe_k"})
"""Fields a config may give per layer (HunYuan-A13B: ``moe_topk``, ``moe_intermediate_size``): the first
entry stands for all, as the published lists are uniform."""
LLAMA4_DENSE_INTERMEDIATE_DEFAULT: Final = 16384
"""``Llama4TextConfig.intermediate_size_mlp``'s default (transformers 5.19), for a config that omits it."""


TOP_K_FIELDS: Final = ("num_experts_per_tok", "moe_topk", "moe_k", "moe_top_k", "num_experts_per_token")
"""Spellings of the experts a token is routed to (the last Kimi Linear's and K3's)."""
MINIMAX_M3_TYPES: Final = frozenset({"minimax_m3_text", "minimax_m3_vl_text"})
"""MiniMax-M3's language model: experts where ``moe_layer_freq`` says 1, dense layers of
``dense_intermediate_size`` (vLLM 0.32.0 ``vllm/models/minimax_m3``; ``MiniMaxM3TextConfig``)."""
_FIRST_DENSE: Final = {"hy_v4": 1}
"""Leading dense layers of a config that neither lists its layers' MLPs nor counts them: HY-V4's one
(``HYV4Config.__post_init__`` fills ``mlp_layer_types`` so, in transformers 5.19 and vLLM 0.32.0); LFM2-MoE
counts its own in ``num_dense_layers``."""
KIMI_LINEAR_TYPES: Final = frozenset({"kimi_linear"})
"""Kimi Linear's and Kimi K3's language model (vLLM 0.32.0 ``vllm/models/kimi_k3``, ``KimiMoE``)."""
KIMI_MIN_WIDTH: Final = 256
"""``KimiMoE``'s ``min_moe_intermediate_per_partition`` when the config has none."""


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
    min_width_per_gpu: int = 0  # Kimi: one GPU's share of an expert's width is padded up to this (TP, no EP)
    expert_hidden_size: int | None = None  # Kimi K3's latent MoE: experts at routed_expert_hidden_size
    latent_norm: bool = False  # and an RMSNorm of that width between them (latent_moe_use_norm)

    def padded_width(self, tensor_parallel_size: int, *, expert_parallel: bool) -> int:
        """The expert width vLLM allocates (Kimi's padded: ``KimiMoE.padded_moe_intermediate_size``)."""
        width, tp = self.expert_intermediate_size, tensor_parallel_size
        if tp > 1 and not expert_parallel and width // tp < self.min_width_per_gpu:
            return self.min_width_per_gpu * tp
        return width

    def latent_projection_parameters(self, hidden_size: int) -> int:
        """A latent MoE layer's down and up projections (whole on every GPU) and its norm; else 0."""
        latent = self.expert_hidden_size
        return 2 * hidden_size * latent + (latent if self.latent_norm else 0) if latent else 0

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


def _int_list(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and bool(value) and all(isinstance(v, int) for v in value)


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
    if model_type in MIMO_TYPES or model_type in MINIMAX_M3_TYPES:
        moe_layers = moe_layer_freq(cfg) or moe_layers
    if model_type in STEP_MOE_TYPES:
        moe_layers = step3p5_moe_layers(cfg, num_layers)
    kinds = cfg.get("mlp_layer_types")  # transformers 5: "dense" or "sparse" (DeepSeek-V4: "moe") per layer
    if isinstance(kinds, list) and kinds and all(isinstance(kind, str) for kind in kinds):
        moe_layers = tuple(i for i, kind in enumerate(kinds) if kind != "dense")
    return moe_layers


def moe_from_config(
    cfg: Mapping[str, Any], model_type: str, intermediate_size: int, num_layers: int
) -> MoeSpec | None:
    """The MoE layers of the language model ``cfg`` describes, or ``None`` for a dense model."""
    widths: object = cfg.get("moe_intermediate_size")
    shared_width: int | None = None  # one shared expert's width, where not the routed experts' width
    if model_type in ERNIE_VL_TYPES and _int_list(widths):  # one width per modality: see the docstring
        cfg, shared_width = {**cfg, "moe_intermediate_size": sum(widths)}, widths[0]
    cfg = {**cfg, **{key: value[0] for key, value in cfg.items() if key in _PER_LAYER and _int_list(value)}}
    experts = first_int(cfg, "num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
    if not experts or (experts <= 1 and model_type not in HUNYUAN_MOE_TYPES):
        return None
    expert_size = first_int(cfg, "moe_intermediate_size", "expert_ffn_hidden_size") or intermediate_size
    if model_type in HUNYUAN_MOE_TYPES:  # transformers' HunYuanMoEV1Experts: intermediate_size wide
        expert_size = shared_width = intermediate_size
    top_k = first_int(cfg, *TOP_K_FIELDS) or 1
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
    if model_type in HUNYUAN_MOE_TYPES:  # one shared_mlp, whatever num_shared_expert says
        shared = 1
    shared_size = shared * (shared_width or expert_size)
    one_shared = first_int(cfg, "shared_expert_intermediate_size", "shared_intermediate_size")
    if model_type in STEP_MOE_TYPES:
        one_shared = step3p5_shared_width(cfg, model_type, expert_size, top_k)
    if one_shared:
        shared, shared_size = 1, one_shared
    kimi = model_type in KIMI_LINEAR_TYPES
    floor = (first_int(cfg, "min_moe_intermediate_per_partition") or KIMI_MIN_WIDTH) if kimi else 0
    return MoeSpec(
        num_experts=experts,
        experts_per_token=top_k,
        expert_intermediate_size=expert_size,
        shared_experts=shared,
        shared_intermediate_size=shared_size,
        dense_layers=first_int(cfg, "first_k_dense_replace", "num_dense_layers")
        or _FIRST_DENSE.get(model_type, 0),
        moe_layers=moe_layers,
        shared_gate=model_type in _SHARED_GATE_TYPES,
        dense_intermediate_size=first_int(cfg, "dense_intermediate_size")
        if model_type in MINIMAX_M3_TYPES
        else None,
        min_width_per_gpu=floor,
        expert_hidden_size=first_int(cfg, "routed_expert_hidden_size") if kimi else None,
        latent_norm=kimi and cfg.get("latent_moe_use_norm") is True,
    )
