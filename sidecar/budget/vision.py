"""Parameters of a multimodal checkpoint's vision tower and projector, from its ``config.json``.

vLLM loads the vision encoder onto the GPU with the language model, so its weights count against
the budget (Qwen2-VL-7B: 0.68B of its 8.29B). Each layout below is transformers' module tree for
the family, term by term, and the corpus test checks each against the model transformers builds
(``tests/data/hf-configs/transformers-reference.json``):

* ``qwen2_vl``: Conv3d patch embedding (no bias), ``depth`` blocks of LayerNorm x 2, fused QKV and
  output projection, an ``mlp_ratio`` x MLP (fc1, fc2), and the patch merger (LayerNorm, two linears);
* ``qwen2_5_vl``: the same with RMSNorms and a gated MLP of ``intermediate_size``;
* ``llava`` (CLIP tower): class and position embeddings, Conv2d patches, pre- and post-LayerNorm, each
  layer's q/k/v/out projections and fc1/fc2 with biases, then the two-layer projector to the text width.

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
    if model_type == "llava" and str(vision.get("model_type", "clip_vision_model")) == "clip_vision_model":
        return _clip_llava(vision, text_hidden)
    return None
