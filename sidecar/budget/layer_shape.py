"""What a family's decoder layer holds beside Llama's: MLP gating, biases, norms, learned positions. Pure.

The parameter count (``sidecar.budget.parameters``) is Llama's layer unless the family says otherwise. Each
rule below is read in transformers 5.19's modelling file of the family (vLLM 0.32.0 loads the same tensors:
``vllm/model_executor/models/<family>.py``), and ``tests/unit/test_defaults_sweep.py`` holds it to the count
of the model transformers builds from every served family's default config:

* **Two-matrix MLPs** (an up and a down projection, no gate): GPT-2, GPT-BigCode, GPT-NeoX, GPT-J, OPT,
  BLOOM, MPT, Phi, Falcon, Nemotron-H; StarCoder2 (``c_fc``/``c_proj``), Arcee, Nemotron and Cosmos3-Edge
  (ReLU^2), Apertus (xIELU, whose two learnt scalars per layer are counted), Jais2.
* **LayerNorms with a bias** (two vectors, not one): Falcon, GPT-2, GPT-BigCode, GPT-NeoX, GPT-J, OPT,
  BLOOM, Phi, StarCoder2, Jais2, Nemotron (``NemotronLayerNorm1P`` is an ``nn.LayerNorm``).
* **Biases**: ``attention_bias`` on q, k and v (Qwen2 and Qwen2-MoE by default) and, where the family's
  output projection takes the same flag, on ``o_proj`` (Llama-derived attention: Llama, gpt-oss, Falcon-H1,
  Jais2, Nemotron, Arcee, Apertus, StarCoder2, ERNIE 4.5, OPT; Qwen2's and GLM-4.5's have none);
  ``mlp_bias`` on every MLP projection; StarCoder2's and ERNIE 4.5's single ``use_bias`` on all of them;
  GPT-2, GPT-BigCode and OPT (``enable_bias``) always.
* **Learned absolute positions**: GPT-2 and GPT-BigCode (``n_positions`` rows), OPT
  (``max_position_embeddings`` + 2: ``OPTLearnedPositionalEmbedding``'s offset).
* **QK norms** of one head's width: Qwen3, Qwen3-MoE, Qwen3-VL (dense and MoE), Gemma 3, LFM2, Apertus,
  AFMoE, EXAONE-MoE, HunYuan v1 (``query_layernorm``, ``key_layernorm``), Step 3.5.
* **Four norms a layer** (before and after attention and MLP): the Gemma families, AFMoE, Muse Glimmer, and
  GLM-4-0414, GLM-4.1V's and GLM-OCR's text models (``post_self_attn_layernorm``, ``post_mlp_layernorm``;
  vLLM 0.32.0's ``glm4.py`` builds them too); AFMoE and Muse Glimmer also gate their attention's output
  (``gate_proj``, hidden x heads x head size).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.budget.config_fields import first_int

FALCON_TYPES = frozenset({"falcon", "RefinedWeb", "RefinedWebModel"})
_GPT2_TYPES = frozenset({"gpt2", "gpt_bigcode"})
_PLAIN_MLP_TYPES = frozenset(
    {"gpt_neox", "gptj", "opt", "bloom", "mpt", "phi", "nemotron_h", "starcoder2", "arcee", "apertus",
     "jais2", "nemotron", "cosmos3_edge_text"} | FALCON_TYPES | _GPT2_TYPES
)  # fmt: skip
_LAYER_NORM_BIAS_TYPES = frozenset(
    {"gpt_neox", "gptj", "opt", "bloom", "phi", "starcoder2", "jais2", "nemotron"}
    | FALCON_TYPES
    | _GPT2_TYPES
)
_OUTPUT_BIAS_TYPES = frozenset(
    {"llama", "gpt_oss", "falcon_h1", "jais2", "nemotron", "arcee", "apertus", "starcoder2", "ernie4_5",
     "ernie4_5_moe"} | _GPT2_TYPES
)  # fmt: skip
_USE_BIAS_TYPES = frozenset({"starcoder2", "ernie4_5", "ernie4_5_moe"})  # one flag for every projection
_QK_NORM_TYPES = frozenset(
    {"qwen3", "qwen3_moe", "qwen3_vl_text", "qwen3_vl_moe_text", "gemma3", "gemma3_text", "lfm2", "lfm2_moe",
     "apertus", "afmoe", "exaone_moe", "hunyuan_v1_dense", "hunyuan_v1_moe", "gemma3n", "gemma3n_text",
     "step3p5"}
)  # fmt: skip
_SANDWICH_NORM_TYPES = frozenset({"afmoe", "muse_glimmer_text", "glm4", "glm4v_text", "glm_ocr_text"})
_ATTENTION_GATE_TYPES = frozenset({"afmoe", "muse_glimmer_text"})
_XIELU_SCALARS = 2  # Apertus's activation: alpha_p and alpha_n, learnt per layer


@dataclass(frozen=True, slots=True)
class LayerShape:
    """The parts of a decoder layer (and the embeddings) that differ between families of the same sizes."""

    gated_mlp: bool = True  # gate, up and down projections (False: an up and a down one)
    norm_bias: bool = False  # LayerNorms with a bias rather than RMSNorms
    norms_per_layer: int = 2
    attention_bias: bool = False  # biases on q, k and v
    output_bias: bool = False  # and on the attention's output projection
    mlp_bias: bool = False  # biases on every MLP projection
    qk_norm: bool = False  # a norm of one head's width on queries and keys
    learned_positions: int = 0  # rows of a learned absolute position table
    activation_parameters: int = 0  # learnt scalars of the activation, per layer
    attention_gate: bool = False  # a hidden x heads gate on the attention's output (AFMoE)


LLAMA_LAYER = LayerShape()
"""Llama's layer: a gated MLP, RMSNorms, no biases."""


def _norms_per_layer(cfg: Mapping[str, Any], model_type: str) -> int:
    if model_type in FALCON_TYPES:
        new = bool(cfg.get("new_decoder_architecture"))
        return 2 if new or not cfg.get("parallel_attn", True) else 1
    return 4 if model_type.startswith("gemma") or model_type in _SANDWICH_NORM_TYPES else 2


def layer_shape(cfg: Mapping[str, Any], model_type: str) -> LayerShape:
    """The layer shape of ``model_type`` as ``cfg`` (defaults filled in) configures it."""
    use_bias = model_type in _USE_BIAS_TYPES and bool(cfg.get("use_bias", model_type == "starcoder2"))
    always = model_type in _GPT2_TYPES or (model_type == "opt" and bool(cfg.get("enable_bias", True)))
    attention_bias = (
        always or use_bias or bool(cfg.get("attention_bias", model_type in {"qwen2", "qwen2_moe"}))
    )
    positions = 0
    if model_type in _GPT2_TYPES:
        positions = first_int(cfg, "n_positions", "max_position_embeddings") or 0
    elif model_type == "opt":
        positions = (first_int(cfg, "max_position_embeddings") or 0) + 2
    return LayerShape(
        gated_mlp=model_type not in _PLAIN_MLP_TYPES,
        norm_bias=model_type in _LAYER_NORM_BIAS_TYPES,
        norms_per_layer=_norms_per_layer(cfg, model_type),
        attention_bias=attention_bias,
        output_bias=attention_bias and model_type in _OUTPUT_BIAS_TYPES | {"opt"},
        mlp_bias=always or use_bias or bool(cfg.get("mlp_bias")),
        qk_norm=model_type in _QK_NORM_TYPES,
        learned_positions=positions,
        activation_parameters=_XIELU_SCALARS if model_type == "apertus" else 0,
        attention_gate=model_type in _ATTENTION_GATE_TYPES,
    )
