"""Parameters of a multimodal checkpoint's vision tower and projector, from its ``config.json``.

vLLM loads the vision encoder onto the GPU with the language model, so its weights count against
the budget (Qwen2-VL-7B: 0.68B of its 8.29B). Each layout below is transformers' module tree for
the family, term by term, and the corpus test checks each against the model transformers builds
(``tests/data/hf-configs/transformers-reference.json``):

* ``qwen2_vl``: Conv3d patch embedding (no bias), ``depth`` blocks of LayerNorm x 2, fused QKV and
  output projection, an ``mlp_ratio`` x MLP (fc1, fc2), and the patch merger (LayerNorm, two linears);
* ``qwen2_5_vl``: the same with RMSNorms and a gated MLP of ``intermediate_size``;
* ``llava`` (CLIP tower): class and position embeddings, Conv2d patches, pre- and post-LayerNorm, each
  layer's q/k/v/out projections and fc1/fc2 with biases, then the two-layer projector to the text width;
* ``llama4`` (``Llama4VisionModel`` and ``Llama4MultiModalProjector``, transformers 5.19
  ``models/llama4/modeling_llama4.py``; vLLM 0.32.0 builds the same tensors in
  ``vllm/model_executor/models/mllama4.py``): the patch embedding, a linear of
  ``num_channels x patch_size^2 -> hidden_size`` without bias (``Llama4UnfoldConvolution``); the class
  embedding and ``(image_size // patch_size)^2 + 1`` position embeddings; pre- and post-LayerNorm;
  ``num_hidden_layers`` encoder layers of q/k/v/o projections with biases (``Llama4VisionAttention``),
  fc1/fc2 of ``intermediate_size`` with biases (``Llama4VisionMLP``) and two LayerNorms; the pixel-shuffle
  adapter's two linears without bias, ``intermediate_size -> projector_input_dim`` and
  ``projector_output_dim -> projector_output_dim`` (``Llama4VisionMLP2``); and the projector,
  ``vision_output_dim -> text hidden`` without bias. Its rotary embedding is a buffer, not a parameter.

Other multimodal families (mllama, gemma3, pixtral, ...) return ``None``: their towers are counted
exactly only from the weights' safetensors headers (a cached checkpoint or the Hub's metadata).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _int(cfg: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _qwen_vl(vision: Mapping[str, Any], text_hidden: int, *, gated: bool) -> int:
    width = _int(vision, "embed_dim", "hidden_size", default=1280)
    depth = _int(vision, "depth", default=32)
    patch, temporal = _int(vision, "patch_size", default=14), _int(vision, "temporal_patch_size", default=2)
    merge = _int(vision, "spatial_merge_size", default=2)
    out = _int(vision, "out_hidden_size", "hidden_size", default=text_hidden) if gated else text_hidden
    channels = _int(vision, "in_chans", "in_channels", default=3)
    norm = width if gated else 2 * width  # RMSNorm weight, or LayerNorm weight and bias
    attention = 4 * width * width + 4 * width  # fused qkv and the output projection, with biases
    if gated:
        inner = _int(vision, "intermediate_size", default=4 * width)
        mlp = 3 * width * inner + 2 * inner + width
    else:
        inner = int(vision.get("mlp_ratio", 4) * width)
        mlp = 2 * width * inner + inner + width
    merged = width * merge * merge
    merger = norm + merged * merged + merged + merged * out + out
    return channels * temporal * patch * patch * width + depth * (2 * norm + attention + mlp) + merger


def _clip_llava(vision: Mapping[str, Any], text_hidden: int) -> int:
    width = _int(vision, "hidden_size", default=1024)
    layers = _int(vision, "num_hidden_layers", default=24)
    inner = _int(vision, "intermediate_size", default=4 * width)
    patch, image = _int(vision, "patch_size", default=14), _int(vision, "image_size", default=336)
    positions = (image // patch) ** 2 + 1
    embeddings = width + 3 * patch * patch * width + positions * width
    layer = 4 * (width * width + width) + 2 * width * inner + inner + width + 4 * width
    projector = width * text_hidden + text_hidden + text_hidden * text_hidden + text_hidden
    return embeddings + 4 * width + layers * layer + projector


def _llama4(vision: Mapping[str, Any], text_hidden: int) -> int:
    width = _int(vision, "hidden_size", default=768)
    heads = _int(vision, "num_attention_heads", default=16)
    inner = _int(vision, "intermediate_size", default=5632)
    patch, image = _int(vision, "patch_size", default=14), _int(vision, "image_size", default=448)
    projector_in = _int(vision, "projector_input_dim", default=4096)
    projector_out = _int(vision, "projector_output_dim", default=4096)
    attention_width = heads * (width // heads)
    embeddings = _int(vision, "num_channels", default=3) * patch * patch * width
    embeddings += width + ((image // patch) ** 2 + 1) * width  # class and position embeddings
    attention = 3 * (width * attention_width + attention_width) + attention_width * width + width
    layer = attention + 2 * width * inner + inner + width + 2 * 2 * width
    adapter = inner * projector_in + projector_out * projector_out
    projector = _int(vision, "vision_output_dim", default=7680) * text_hidden
    return (
        embeddings
        + 2 * 2 * width
        + _int(vision, "num_hidden_layers", default=34) * layer
        + adapter
        + projector
    )


def vision_parameters(config: Mapping[str, Any], text_hidden: int) -> int | None:
    """The vision tower's and projector's parameters, ``0`` for a text model, ``None`` when not modelled."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return 0
    model_type = str(config.get("model_type") or "")
    if model_type == "qwen2_vl":
        return _qwen_vl(vision, text_hidden, gated=False)
    if model_type == "qwen2_5_vl":
        return _qwen_vl(vision, text_hidden, gated=True)
    if model_type == "llama4":
        return _llama4(vision, text_hidden)
    if model_type == "llava" and str(vision.get("model_type", "clip_vision_model")) == "clip_vision_model":
        return _clip_llava(vision, text_hidden)
    return None
