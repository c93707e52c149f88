"""Parameter count computed from an :class:`~sidecar.budget.architecture.Architecture`.

Used when a model directory has no weight files (a catalog entry, or a bare ``config.json``).
It counts the tensors a Llama-style decoder has: embeddings (and an untied LM head), per layer
the attention projections (with biases where the family has them, QK norms, or MLA's low-rank
projections), a gated MLP (or Falcon's and GPT-2's two matrices) or, in the layers
:mod:`sidecar.budget.moe` makes MoE layers, the experts, the router and shared experts, the norms, and the
vision tower where :mod:`sidecar.budget.vision` models it. Llama 4's QK norm (``Llama4TextL2Norm``) has no
weight and adds nothing. Tests
compare the result with the published counts of every catalog model (within 1%) and with the models
transformers builds from every corpus config.
"""

from __future__ import annotations

from sidecar.budget import gemma4, zamba2
from sidecar.budget.architecture import Architecture, MlaSpec
from sidecar.budget.deepseek_v41 import v41_layer_parameters
from sidecar.budget.layer_kinds import LayerKind
from sidecar.budget.longcat import ATTENTION_BLOCKS
from sidecar.budget.state_layers import QWEN_GATED_ATTENTION_TYPES

_GATED_MLP_MATRICES = 3  # gate, up and down projections
SINGLE_BLOCK_TYPES = frozenset({"nemotron_h"})
"""Families whose layers hold one block each (Nemotron-H: ``M`` Mamba2, ``*`` attention, ``-`` MLP)."""


_FULL_WIDTH_QK_NORM_TYPES = frozenset({"olmo2", "olmo3", "olmo_hybrid"})


def _attention_parameters(arch: Architecture, kind: LayerKind, layer: int) -> int:
    hidden = arch.hidden_size
    if arch.mla is not None:
        return _mla_parameters(arch, arch.mla)
    if arch.v4 is not None and arch.v4.v41:  # DeepSeek-V4.1: compressors and indexers in source layers only
        return v41_layer_parameters(arch.v4, hidden, arch.num_attention_heads, layer)
    if arch.v4 is not None:  # DeepSeek-V4 (sidecar.budget.deepseek_v4): a layer's own ratio
        return arch.v4.layer_parameters(hidden, arch.num_attention_heads, arch.v4.ratios[layer])
    if arch.mimo is not None:  # MiMo-V2, Step 3.5: each kind its own heads
        return arch.mimo.attention_parameters(
            hidden, sliding=kind is LayerKind.SLIDING, qk_norm=arch.shape.qk_norm
        )
    q_size = arch.num_attention_heads * arch.head_dim
    kv_size = arch.num_kv_heads * arch.head_dim
    total = hidden * (q_size + 2 * kv_size) + q_size * hidden
    if arch.shape.attention_bias:
        total += q_size + 2 * kv_size + (hidden if arch.shape.output_bias else 0)
    if arch.shape.qk_norm:
        total += 2 * arch.head_dim
    if arch.model_type in _FULL_WIDTH_QK_NORM_TYPES:  # OLMo 2's q_norm and k_norm span the projections
        total += q_size + kv_size
    if arch.shape.attention_gate:
        total += hidden * q_size
    if arch.model_type in QWEN_GATED_ATTENTION_TYPES:  # Qwen3-Next, Qwen3.5: a gate on the output
        total += hidden * q_size + 2 * arch.head_dim  # q_proj twice as wide, q and k norms
    return total


def _mla_parameters(arch: Architecture, mla: MlaSpec) -> int:
    hidden, heads = arch.hidden_size, arch.num_attention_heads
    qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank:
        query = hidden * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * heads * qk_head
    else:
        query = hidden * heads * qk_head
    kv_down = hidden * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
    kv_up = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    out = heads * mla.v_head_dim * hidden
    return query + kv_down + kv_up + out


def _mlp_parameters(arch: Architecture, layer: int) -> int:
    hidden = arch.hidden_size
    moe = arch.moe
    gated = arch.shape.gated_mlp
    matrices = _GATED_MLP_MATRICES if gated else 2  # Nemotron-H's experts too: up and down (relu2)
    if moe is None or not moe.is_moe_layer(layer):
        width = dense_mlp_width(arch)
        biases = ((2 if gated else 1) * width + hidden) if arch.shape.mlp_bias else 0
        return matrices * hidden * width + biases + arch.shape.activation_parameters
    experts = moe.num_experts * matrices * (moe.expert_hidden_size or hidden) * moe.expert_intermediate_size
    shared = matrices * hidden * moe.shared_intermediate_size + (hidden if moe.shared_gate else 0)
    router = hidden * moe.num_experts
    return experts + shared + router + moe.latent_projection_parameters(hidden)


def _norm_parameters(arch: Architecture) -> int:
    return 2 * arch.hidden_size if arch.shape.norm_bias else arch.hidden_size


def _gemma4_layer_parameters(arch: Architecture, spec: gemma4.Gemma4Layers, layer: int) -> int:
    """A Gemma 4 layer (:mod:`sidecar.budget.gemma4`): attention, MLP, MoE block, four norms."""
    hidden, full = arch.hidden_size, arch.layer_kinds[layer] is LayerKind.FULL
    shared = layer >= arch.num_layers - arch.kv_shared_layers
    geometry = arch.full_attention_geometry() if full else (arch.head_dim, arch.num_kv_heads)
    attention = gemma4.attention_parameters(
        spec, hidden, arch.num_attention_heads, geometry, full=full, shared=shared
    )
    width = arch.intermediate_size * (2 if shared and spec.double_wide_shared_mlp else 1)
    mlp = _GATED_MLP_MATRICES * hidden * width
    moe = arch.moe
    if moe is not None:
        experts = moe.num_experts * _GATED_MLP_MATRICES * hidden * moe.expert_intermediate_size
        mlp += experts + hidden * moe.num_experts + gemma4.moe_block_extras(moe.num_experts, hidden)
    return attention + mlp + 4 * hidden


def layer_parameter_count(arch: Architecture, layer: int) -> int:
    """Parameters of decoder layer ``layer``: attention (or a state mixer), its MLP or MoE, its norms."""
    if arch.gemma4 is not None:
        return _gemma4_layer_parameters(arch, arch.gemma4, layer)
    if arch.zamba2 is not None and arch.state is not None:  # a Mamba2 layer; the shared blocks apart
        return arch.state.mixer_parameters(arch.hidden_size) + arch.hidden_size
    norm = _norm_parameters(arch)
    kind = arch.layer_kinds[layer] if layer < len(arch.layer_kinds) else LayerKind.FULL
    state = arch.state if kind is LayerKind.STATE else None
    mixer = state.mixer_parameters(arch.hidden_size) if state else _attention_parameters(arch, kind, layer)
    if arch.parallel_state_layers and arch.state is not None:  # Falcon-H1: a Mamba2 mixer beside attention
        mixer += arch.state.mixer_parameters(arch.hidden_size)
    if arch.model_type in SINGLE_BLOCK_TYPES:  # one block a layer: a mixer, attention or an MLP, one norm
        return norm + (mixer if kind in (LayerKind.STATE, LayerKind.FULL) else _mlp_parameters(arch, layer))
    norms = arch.shape.norms_per_layer * norm
    if arch.longcat is not None and arch.moe is not None:  # two attention blocks and MLPs, then experts
        blocks, hidden = ATTENTION_BLOCKS, arch.hidden_size
        dense = blocks * _GATED_MLP_MATRICES * hidden * arch.intermediate_size
        experts = _mlp_parameters(arch, layer) + arch.longcat.router_extras(hidden, arch.moe.num_experts)
        return blocks * (mixer + norms) + dense + experts
    if arch.indexer is not None and layer in arch.indexer.layers:  # DeepSeek-V3.2's indexer
        mixer += arch.indexer.parameters(arch.hidden_size)
    if arch.gemma3n is not None:  # AltUp, LAuReL, per-layer inputs; a KV-shared layer has no k, v, k_norm
        mixer += arch.gemma3n.layer_extras(arch.hidden_size)
        if layer >= arch.num_layers - arch.kv_shared_layers:
            mixer -= 2 * arch.hidden_size * arch.num_kv_heads * arch.head_dim + arch.head_dim
    return mixer + _mlp_parameters(arch, layer) + norms


def computed_parameter_count(arch: Architecture) -> int:
    """Total parameters of the language model described by ``arch``."""
    layers = sum(layer_parameter_count(arch, i) for i in range(arch.num_layers))
    if arch.gemma4 is not None:  # Gemma 4's per-layer input embeddings
        layers += gemma4.per_layer_input_parameters(arch.gemma4, arch.hidden_size, arch.num_layers)
    if arch.gemma3n is not None:
        layers += arch.gemma3n.model_extras(arch.hidden_size, arch.num_layers)
    if arch.v4 is not None and not arch.v4.v41:  # V4.1 has no learned hc_head (vLLM 0.32.0 nvidia/model.py)
        layers += arch.v4.head_parameters(arch.hidden_size)
    if arch.zamba2 is not None:  # Zamba2's shared transformer blocks, adapters and hybrid projections
        attention = (arch.num_attention_heads, arch.head_dim)
        layers += zamba2.shared_parameters(arch.zamba2, arch.hidden_size, arch.intermediate_size, attention)
    return embedding_parameter_count(arch) + layers + _norm_parameters(arch) + (arch.vision_parameters or 0)


def body_parameter_count(arch: Architecture) -> int:
    """Parameters outside the embeddings, the LM head and the final norm: the layers (and a vision tower)."""
    return parameter_count(arch) - embedding_parameter_count(arch) - _norm_parameters(arch)


def parameter_count(arch: Architecture) -> int:
    """The measured parameter count when the weight files gave one, else the computed one."""
    return arch.parameter_count if arch.parameter_count is not None else computed_parameter_count(arch)


def embedding_parameter_count(arch: Architecture) -> int:
    """Parameters of the token embeddings and the LM head (one matrix when tied), and learned positions."""
    tokens = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return tokens + arch.shape.learned_positions * arch.hidden_size


def expert_parameter_count(arch: Architecture) -> int:
    """Parameters of the routed MoE experts (the part MXFP4 checkpoints quantise), 0 for dense models."""
    moe = arch.moe
    if moe is None:
        return 0
    width = moe.expert_hidden_size or arch.hidden_size  # Kimi K3: its latent width
    per_layer = moe.num_experts * _GATED_MLP_MATRICES * width * moe.expert_intermediate_size
    return per_layer * moe.moe_layer_count(arch.num_layers)


def dense_mlp_width(arch: Architecture) -> int:
    """The ordinary MLP's width (Llama 4: ``intermediate_size_mlp``, :mod:`sidecar.budget.moe`)."""
    moe = arch.moe
    if moe is not None and moe.dense_intermediate_size is not None:
        return moe.dense_intermediate_size
    return arch.intermediate_size
