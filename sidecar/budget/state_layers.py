"""Recurrent-state layers (gated DeltaNet, Mamba2, Mamba1, short conv): their pages in vLLM's pool. Pure.

Theory of operation
-------------------
A hybrid model such as Qwen3-Next, Qwen3.5, OLMo-Hybrid, Nemotron-H, Granite-4.0-H, Jamba or LFM2 keeps KV
only in its attention layers (Falcon-H1 runs a Mamba2 mixer beside the attention of every layer); its state
layers carry a fixed-size *state* per sequence (a short convolution window, and an SSM or DeltaNet matrix
but in LFM2's short convolutions), whatever the sequence's length. vLLM draws both from one pool (vLLM
0.32.0 as installed; the rules below read in the release wheels named):

* **State page** (``MambaSpec.page_size_bytes``, ``vllm/v1/kv_cache_interface.py``): per layer and GPU, the
  conv state ``(conv_kernel - 1 + k) x conv_dim / tp`` in the model's dtype plus the temporal state in
  ``mamba_ssm_cache_dtype`` (``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator``,
  ``vllm/model_executor/layers/mamba/mamba_utils.py``; ``k`` the speculative tokens). Gated DeltaNet
  (``gated_delta_net_state_shape``): ``conv_dim = 2 x key_heads x key_dim + value_heads x value_dim``,
  temporal ``value_heads / tp x value_dim x key_dim``. Mamba2 (``mamba2_state_shape``):
  ``conv_dim = intermediate + 2 x groups x state`` (groups padded to a multiple of ``tp`` by
  ``extra_groups_for_head_shards``; Falcon-H1's intermediate is ``mamba_d_ssm`` when set), temporal
  ``heads / tp x head_dim x state``. Mamba1 (Jamba, ``mamba1_state_shape``): conv ``(conv_kernel - 1) x inner
  / tp`` with no draft slots, temporal ``inner / tp x state``, ``inner = mamba_expand x hidden``. Short conv
  (LFM2, ``short_conv_state_shape``): the conv window alone over ``conv_dim`` (LFM2-MoE: ``hidden_size``),
  with draft slots from 0.29.0 (:meth:`StateRules.conv_draft_slots`).
* **SSM dtype** ``auto`` is the model's dtype, except where the model's config hook says otherwise
  (``vllm/model_executor/models/config.py``): Nemotron-H takes its config's ``mamba_ssm_cache_dtype``, else
  ``float32``; Qwen3.5 its config's ``mamba_ssm_dtype``. (The CPU platform turns it to ``float32``
  unless it runs the accelerated DeltaNet kernel in 16 bits: ``vllm/platforms/cpu.py``.)
* **Block size** (``Platform._align_hybrid_block_size``, ``vllm/platforms/interface.py``): an attention
  page must hold a state page, so the block grows to ``a x ceil(state / (a x per_token))`` tokens with
  ``a = max(16, --block-size)`` (the attention kernels' smallest block on GPUs, :data:`KERNEL_BLOCK`),
  and the state page is padded to the attention page. Qwen3-Next-80B on one GPU: 544 tokens a block.
* **Groups**: state layers form KV cache groups as attention layers do
  (:func:`sidecar.budget.kv_groups.kv_groups`), and each block is one page in each layer of a group.
* **Blocks a request holds** per state group (``MambaSpec.max_memory_usage_bytes``): ``1 + k`` without
  prefix caching (mamba cache mode ``none``); with it (mode ``align``) ``2 + k``, plus one prefill
  checkpoint for Mamba2 mixers from 0.32 (``MambaMixer2.get_kv_cache_spec``). Hybrid models get prefix
  caching by default from the release in :meth:`StateRules.prefix_caching_default` (``is_prefix_caching_
  supported`` in ``vllm/config/model.py``: refused for hybrids in 0.15.0 to 0.25.0, accepted from 0.26.0);
  0.26.0 and 0.27.0 chose mode ``all`` (a state page per block of the sequence, and blocks a multiple of
  the Mamba2 chunk) for the classes that support it (``SupportsMambaPrefixCaching``: Nemotron-H,
  Granite-4.0-H, Falcon-H1; Jamba too, but with no Mamba chunk in its config vLLM's alignment asserts, so
  that case is not modelled), ``align`` from 0.28.0 (``MambaModelConfig`` in
  ``vllm/model_executor/models/config.py``). Read in the 0.15.0, 0.20.0-0.22.0, 0.24.0-0.29.0, 0.31.0 and
  0.32.0 wheels.

Checked on the real CPU engine (``tests/e2e/test_state_layers.py``): a tiny Qwen3-Next (three DeltaNet
layers and one attention layer), a tiny Nemotron-H (two Mamba2 layers, one attention layer), a Granite-4.0-H,
a two-layer Falcon-H1 (attention and Mamba2 side by side) and an LFM2 (three short convs, one attention
layer) hold the block size, groups, blocks and maximum concurrency the plan gives, with both SSM dtypes.
Jamba's Mamba1 layers fail in the CPU engine's forward pass and OLMo-Hybrid's DeltaNet needs Triton, so their
rules are read in the source only (OLMo-Hybrid's state is ``gated_delta_net_state_shape``, as Qwen3-Next's).

Zamba2 runs a Mamba2 mixer in every layer and its shared attention block before the ``hybrid`` ones
(:mod:`sidecar.budget.zamba2`); the tiny one of ``tests/e2e/test_state_layers.py`` is planned as the engine
sizes it. Not modelled (``plan`` says so in a note, :func:`sidecar.budget.kv_terms.state_note`): Kimi Linear's
KDA, MiniMax and Ling linear attention. Nor are ReplaySSM's rings (``--mamba-backend``),
``--mamba-block-size`` (0.32.0 overrides it with the block size in mode ``align``), pipeline stages with
state layers, MLA attention beside state layers (its kernels' 128-token alignment) and the larger kernel
blocks of Blackwell's FlashAttention 4 for 256-wide heads (``_get_fa4_hd256_block_size``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.budget.config_fields import first_int
from sidecar.budget.dtypes import FLOAT_DTYPES, normalise_dtype, serving_dtype, weight_bytes_per_param
from sidecar.errors import ConfigError, UsageError

KERNEL_BLOCK: Final = 16
"""The smallest block vLLM's GPU attention kernels take (``MultipleOf(16)`` in FlashAttention, Triton)."""
DEFAULT_MAMBA_CHUNK: Final = 2048
"""``ModelConfig.get_mamba_chunk_size`` when a config names no chunk."""
GATED_DELTA_NET: Final = "gated_delta_net"
MAMBA2: Final = "mamba2"
MAMBA1: Final = "mamba1"
SHORT_CONV: Final = "short_conv"
_MAMBA1_TYPES = frozenset({"jamba"})
_SHORT_CONV_TYPES = frozenset({"lfm2", "lfm2_moe"})
SHORT_CONV_DRAFT_SLOTS_SINCE: Final = 29  # short_conv_state_shape's num_spec (0.28.0: none)
_DT_RANK_DIVISOR = 16  # JambaConfig: mamba_dt_rank "auto" is ceil(hidden_size / 16)
QWEN_GATED_ATTENTION_TYPES: Final = frozenset(
    {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}
)  # gated DeltaNet beside attention whose q_proj also yields an output gate
_GDN_TYPES = QWEN_GATED_ATTENTION_TYPES | {"olmo_hybrid"}
_MAMBA2_FIELDS = {  # heads, head size, groups, state size, conv kernel (get_mamba_state_shape_from_config)
    "nemotron_h": ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel"),
    "granitemoehybrid": ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv"),
    "falcon_h1": ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv"),
    "zamba2": ("n_mamba_heads", "mamba_headdim", "mamba_ngroups", "mamba_d_state", "mamba_d_conv"),
}
_FLOAT32_SSM_TYPES = frozenset({"nemotron_h"})  # NemotronHForCausalLMConfig.DEFAULT_MAMBA_SSM_CACHE_DTYPE


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One state layer's shape, before tensor parallelism."""

    mixer: str  # GATED_DELTA_NET, MAMBA2, MAMBA1 or SHORT_CONV
    conv_dim: int  # channels of the convolution window (Mamba2: groups not yet padded for TP)
    conv_kernel: int
    heads: int  # value heads (DeltaNet) or SSM heads (Mamba2), split over TP
    head_dim: int  # value head size (DeltaNet) or Mamba2 head size
    state_dim: int  # key head size (DeltaNet) or SSM state size (Mamba2)
    groups: int = 0  # Mamba2's B/C groups (their 2 x groups x state channels are in conv_dim)
    ssm_dtype: str | None = None  # the config's own SSM state dtype for ``auto``
    chunk_size: int = 0  # Mamba2's SSD chunk (``get_mamba_chunk_size``): mode ``all`` aligns blocks to it
    projection_bias: tuple[bool, bool] = (False, False)  # in_proj's and out_proj's biases (Falcon-H1's flags)
    conv_bias: bool = True
    gated_norm: bool = True  # the gated RMSNorm before out_proj (Falcon-H1: only with ``mamba_rms_norm``)
    dt_rank: int = 0  # Mamba1's time-step rank (x_proj, dt_proj)

    def page_bytes(
        self,
        tensor_parallel_size: int,
        model_dtype: str,
        ssm_cache_dtype: str,
        speculative_tokens: int,
        conv_cache_dtype: str = "auto",
    ) -> int:
        """One layer's state on one GPU (``MambaSpec.page_size_bytes`` before padding)."""
        tp = tensor_parallel_size
        conv_dim = self.conv_dim
        if self.mixer == MAMBA2 and self.groups % tp:
            conv_dim += 2 * (tp - self.groups) * self.state_dim  # extra_groups_for_head_shards
        conv = (self.conv_kernel - 1 + speculative_tokens) * (conv_dim // tp)
        temporal = (self.heads // tp) * self.head_dim * self.state_dim
        conv_dtype, ssm_dtype = self.state_dtypes(model_dtype, conv_cache_dtype, ssm_cache_dtype)
        return round(conv * weight_bytes_per_param(conv_dtype) + temporal * weight_bytes_per_param(ssm_dtype))

    def state_dtypes(self, model_dtype: str, conv_cache_dtype: str, ssm_cache_dtype: str) -> tuple[str, str]:
        """The conv and SSM states' dtypes (``MambaStateDtypeCalculator._mamba_state_dtype``, 0.15.0-0.32.0).

        The conv state in ``--mamba-cache-dtype`` (``auto``: the model's dtype); the SSM state in
        ``--mamba-ssm-cache-dtype``, whose ``auto`` is the model's hook (:attr:`ssm_dtype`: Nemotron-H,
        Qwen3.5) where it has one, else the conv state's dtype.
        """
        conv = _state_dtype(conv_cache_dtype, model_dtype)
        given = (self.ssm_dtype or conv) if ssm_cache_dtype == "auto" else ssm_cache_dtype
        return conv, _state_dtype(given, model_dtype)

    def mixer_parameters(self, hidden: int) -> int:
        """The mixer's weights, as transformers builds them (``Qwen3NextGatedDeltaNet``, ``*Mamba2Mixer``)."""
        value = self.heads * self.head_dim
        if self.mixer == SHORT_CONV:  # Lfm2ShortConv: in_proj to B, C, x; a depthwise conv; out_proj
            return (hidden + self.conv_bias) * 4 * hidden + hidden * (self.conv_kernel + self.conv_bias)
        if self.mixer == MAMBA1:
            return self._mamba1_parameters(hidden)
        if self.mixer == GATED_DELTA_NET:
            key = (self.conv_dim - value) // 2
            projections = hidden * (2 * key + 2 * value + 2 * self.heads) + value * hidden  # qkvz, ba, out
            conv = self.conv_dim * self.conv_kernel  # no bias
            return projections + conv + 2 * self.heads + self.head_dim  # dt_bias, A_log, the gated norm
        projection = value + self.conv_dim + self.heads  # z, x B C, dt
        in_bias, out_bias = self.projection_bias
        in_proj = (hidden + in_bias) * projection
        conv = self.conv_dim * (self.conv_kernel + self.conv_bias)
        norm = value if self.gated_norm else 0
        return in_proj + conv + 3 * self.heads + norm + (value + out_bias) * hidden  # dt_bias, A_log, D

    def _mamba1_parameters(self, hidden: int) -> int:
        """``JambaMambaMixer``: in_proj, conv, x_proj (dt, B, C), dt_proj, A_log, D, out_proj, three norms."""
        inner, rank, state = self.conv_dim, self.dt_rank, self.state_dim
        in_bias, out_bias = self.projection_bias
        in_proj = (hidden + in_bias) * 2 * inner
        conv = inner * (self.conv_kernel + self.conv_bias)
        selective = inner * (rank + 2 * state) + (rank + 1) * inner + inner * state + inner  # x, dt, A_log, D
        return in_proj + conv + selective + (inner + out_bias) * hidden + rank + 2 * state

    def checkpoint_blocks(self, release_minor: int) -> int:
        """Blocks a request holds for the prefill checkpoint in mode ``align`` (Mamba2 from 0.32)."""
        return 1 if self.mixer == MAMBA2 and release_minor >= 32 else 0


def state_spec(cfg: Mapping[str, Any], model_type: str) -> StateSpec | None:
    """The state layers' shape from a config (defaults merged), or ``None`` for a model without them."""
    if model_type in _GDN_TYPES:
        key_heads, value_heads = _field(cfg, "linear_num_key_heads"), _field(cfg, "linear_num_value_heads")
        key_dim, value_dim = _field(cfg, "linear_key_head_dim"), _field(cfg, "linear_value_head_dim")
        ssm = cfg.get("mamba_ssm_dtype") if model_type.startswith("qwen3_5") else None
        return StateSpec(
            mixer=GATED_DELTA_NET,
            conv_dim=2 * key_heads * key_dim + value_heads * value_dim,
            conv_kernel=_field(cfg, "linear_conv_kernel_dim"),
            heads=value_heads,
            head_dim=value_dim,
            state_dim=key_dim,
            ssm_dtype=str(ssm) if ssm else None,
        )
    if model_type in _SHORT_CONV_TYPES:  # lfm2.py: conv_dim; lfm2_moe.py: hidden_size
        width = first_int(cfg, "conv_dim") if model_type == "lfm2" else None
        return StateSpec(
            mixer=SHORT_CONV,
            conv_dim=width or _field(cfg, "hidden_size"),
            conv_kernel=_field(cfg, "conv_L_cache"),
            heads=0,
            head_dim=0,
            state_dim=0,
            conv_bias=bool(cfg.get("conv_bias")),
        )
    if model_type in _MAMBA1_TYPES:
        return _mamba1_spec(cfg)
    if model_type in _MAMBA2_FIELDS:
        heads, head_dim, groups, state, kernel = _mamba2_fields(cfg, model_type)
        intermediate = heads * head_dim if model_type == "nemotron_h" else _mamba_intermediate(cfg)
        falcon, zamba = model_type == "falcon_h1", model_type == "zamba2"
        ssm = cfg.get("mamba_ssm_cache_dtype") or ("float32" if model_type in _FLOAT32_SSM_TYPES else None)
        return StateSpec(
            mixer=MAMBA2,
            conv_dim=intermediate + 2 * groups * state,
            conv_kernel=kernel,
            heads=heads,
            head_dim=head_dim,
            state_dim=state,
            groups=groups,
            ssm_dtype=str(ssm) if ssm else None,
            chunk_size=first_int(cfg, "mamba_chunk_size", "chunk_size") or DEFAULT_MAMBA_CHUNK,
            projection_bias=(
                (falcon and bool(cfg.get("mamba_proj_bias"))) or (zamba and bool(cfg.get("add_bias_linear"))),
                (falcon and bool(cfg.get("projectors_bias"))) or (zamba and bool(cfg.get("add_bias_linear"))),
            ),
            conv_bias=zamba or bool(cfg.get("mamba_conv_bias", True)),  # Zamba2Mixer: a conv bias always
            gated_norm=not falcon or bool(cfg.get("mamba_rms_norm")),
        )
    return None


def _mamba1_spec(cfg: Mapping[str, Any]) -> StateSpec:
    """Jamba's Mamba1 mixers (``jamba.py``: ``mamba1_state_shape`` of ``mamba_expand x hidden_size``)."""
    hidden = _field(cfg, "hidden_size")
    inner = _field(cfg, "mamba_expand") * hidden
    rank = None if cfg.get("mamba_dt_rank") == "auto" else first_int(cfg, "mamba_dt_rank")
    return StateSpec(
        mixer=MAMBA1,
        conv_dim=inner,
        conv_kernel=_field(cfg, "mamba_d_conv"),
        heads=inner,  # the temporal state is inner x state: one "head" of size 1 per channel
        head_dim=1,
        state_dim=_field(cfg, "mamba_d_state"),
        projection_bias=(bool(cfg.get("mamba_proj_bias")), bool(cfg.get("mamba_proj_bias"))),
        conv_bias=bool(cfg.get("mamba_conv_bias", True)),
        dt_rank=rank or math.ceil(hidden / _DT_RANK_DIVISOR),
    )


def _mamba_intermediate(cfg: Mapping[str, Any]) -> int:
    """The Mamba2 inner width: ``mamba_d_ssm`` when given (``FalconH1Mixer``), else expand x hidden."""
    return first_int(cfg, "mamba_d_ssm") or _field(cfg, "mamba_expand") * _field(cfg, "hidden_size")


def _mamba2_fields(cfg: Mapping[str, Any], model_type: str) -> tuple[int, int, int, int, int]:
    """Heads, head size, groups, state size, conv kernel; a head size of ``auto`` (Falcon-H1) derived."""
    names = _MAMBA2_FIELDS[model_type]
    heads, groups, state, kernel = (_field(cfg, name) for name in (names[0], *names[2:]))
    head_dim = None if cfg.get(names[1]) == "auto" or model_type == "zamba2" else first_int(cfg, names[1])
    if head_dim is None:  # "auto" (FalconH1Config), or always (Zamba2Config): the intermediate over the heads
        head_dim = _mamba_intermediate(cfg) // heads
    return heads, head_dim, groups, state, kernel


def _state_dtype(dtype: str, model_dtype: str) -> str:
    """A state dtype setting as a dtype: ``auto`` is the model's; else float32, bfloat16 or float16."""
    key = serving_dtype(model_dtype) if dtype == "auto" else normalise_dtype(dtype)
    if key not in FLOAT_DTYPES:
        raise UsageError(f"unknown Mamba SSM cache dtype {dtype!r}: use auto, float32, bfloat16 or float16")
    return key


def _field(cfg: Mapping[str, Any], name: str) -> int:
    value = first_int(cfg, name)
    if value is None or value <= 0:
        raise ConfigError(f"config.json lacks a positive {name!r}, which its state layers need")
    return value


def hybrid_block_size(
    block_size: int, state_page: int, attention_bytes_per_token: int, chunk: int = 0
) -> int:
    """The block size vLLM settles on so one attention page holds a state page (see the module docstring).

    ``chunk``: in mode ``all`` the block is a multiple of the Mamba2 chunk as well (0.26, 0.27).
    """
    if state_page <= 0 or attention_bytes_per_token <= 0:
        return block_size
    align = max(KERNEL_BLOCK, block_size)
    if chunk:
        step = math.lcm(chunk, align)
        needed = step * math.ceil(math.ceil(state_page / attention_bytes_per_token) / step)
    else:
        needed = align * math.ceil(state_page / (align * attention_bytes_per_token))
    needed = KERNEL_BLOCK * math.ceil(needed / KERNEL_BLOCK)
    return max(block_size, needed)


@dataclass(frozen=True, slots=True)
class StateRules:
    """How a release treats state layers: prefix caching by default, and the cache mode it then picks."""

    minor: int

    def prefix_caching_default(self) -> bool:
        """Whether a hybrid model gets prefix caching unless told otherwise: from 0.26.0 (0.25.0: not)."""
        return self.minor >= 26

    def conv_draft_slots(self, spec: StateSpec, speculative_tokens: int) -> int:
        """Draft-token slots in the conv window: none for Mamba1, none for short convs before 0.29."""
        if spec.mixer == MAMBA1 or (spec.mixer == SHORT_CONV and self.minor < SHORT_CONV_DRAFT_SLOTS_SINCE):
            return 0
        return speculative_tokens

    def mode(self, spec: StateSpec, *, prefix_caching: bool) -> str:
        """The mamba cache mode vLLM picks: ``none`` without prefix caching, else ``all`` or ``align``."""
        if not prefix_caching:
            return "none"
        return "all" if self.minor < 28 and spec.mixer == MAMBA2 else "align"

    def blocks_per_request(
        self, spec: StateSpec, *, mode: str, speculative_tokens: int, sequence_blocks: int
    ) -> int:
        """Blocks one request holds in one state group (``MambaSpec.max_memory_usage_bytes``)."""
        if mode == "none":
            return 1 + speculative_tokens
        if mode == "all":  # a state per block of the sequence
            return sequence_blocks
        return 2 + speculative_tokens + spec.checkpoint_blocks(self.minor)
