"""The LLaVA-style towers: a CLIP, SigLIP or Pixtral encoder and LLaVA's projector.

Each as transformers 5.19 builds it (the tests check each against the model it builds):

* ``llava`` (CLIP tower): class and position embeddings, Conv2d patches, pre- and post-LayerNorm, each
  layer's q/k/v/out projections and fc1/fc2 with biases, then the two-layer projector to the text width;
  ``llava_next``, ``llava_next_video`` and ``llava_onevision`` add ``image_newline``, one text-width row
  (``LlavaNextModel``, ``LlavaOnevisionModel``), OneVision over a SigLIP tower;
* ``pixtral`` (``PixtralVisionModel``, transformers 5.19 ``models/pixtral/modeling_pixtral.py``; vLLM 0.32.0
  ``pixtral.py`` loads the same tensors): a Conv2d patch embedding without bias, a pre-norm, layers of q/k/v/o
  projections without bias, a gated MLP and two RMSNorms, no final norm (its 2D rotary embedding is a
  buffer). Under ``mistral3`` (Mistral-Small-3.1 and 3.2) the projector is ``Mistral3MultiModalProjector``:
  an RMSNorm of the vision width, the patch merger (``vision x spatial_merge_size^2 -> vision``, no bias) and
  two linears to the text width (biases when ``multimodal_projector_bias``); under ``llava`` (Pixtral-12B)
  the two linears of ``LlavaMultiModalProjector``, with biases by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.budget.config_fields import int_field as _int
from sidecar.budget.vision_blocks import siglip, two_linears

LLAVA_TYPES = frozenset({"llava", "mistral3", "llava_next", "llava_next_video", "llava_onevision"})
"""Families whose tower and projector follow LLaVA's (``LlavaNext*`` and ``LlavaOnevision*`` add one
text-width ``image_newline``); the vision config's own type says which tower."""


def _clip_llava(vision: Mapping[str, Any], text_hidden: int) -> int:
    width = _int(vision, "hidden_size", default=1024)
    layers = _int(vision, "num_hidden_layers", default=24)
    inner = _int(vision, "intermediate_size", default=4 * width)
    patch, image = _int(vision, "patch_size", default=14), _int(vision, "image_size", default=336)
    positions = (image // patch) ** 2 + 1
    embeddings = width + 3 * patch * patch * width + positions * width
    layer = 4 * (width * width + width) + 2 * width * inner + inner + width + 4 * width
    return embeddings + 4 * width + layers * layer + two_linears(width, text_hidden, bias=True)


def _pixtral(vision: Mapping[str, Any]) -> int:
    width = _int(vision, "hidden_size", default=1024)
    inner = _int(vision, "intermediate_size", default=4096)
    heads = _int(vision, "num_attention_heads", default=16)
    head_dim = _int(vision, "head_dim", default=width // heads)
    patch = _int(vision, "patch_size", default=16)
    layer = 4 * width * heads * head_dim + 3 * width * inner + 2 * width
    return (
        _int(vision, "num_channels", default=3) * patch * patch * width
        + width
        + _int(vision, "num_hidden_layers", default=24) * layer
    )


def _pixtral_mistral3(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    width, merge = _int(vision, "hidden_size", default=1024), _int(top, "spatial_merge_size", default=2)
    merger = width * width * merge * merge + width  # the patch merger and the projector's RMSNorm
    bias = bool(top.get("multimodal_projector_bias", False))
    return _pixtral(vision) + merger + two_linears(width, text_hidden, bias=bias)


def llava_family(
    model_type: str, config: Mapping[str, Any], vision: Mapping[str, Any], text: int
) -> int | None:
    """The LLaVA-style families: the vision config's type names the tower (``None``: one not modelled)."""
    tower_type = str(vision.get("model_type", "clip_vision_model"))
    mistral3_tower = tower_type in ("pixtral", "clip_vision_model")
    if model_type == "mistral3":
        return _pixtral_mistral3(config, vision, text) if mistral3_tower else None
    bias = bool(config.get("multimodal_projector_bias", True))
    newline = 0 if model_type == "llava" else text  # LlavaNext* and LlavaOnevision*: ``image_newline``
    if tower_type == "clip_vision_model":
        return _clip_llava(vision, text) + newline
    if tower_type == "pixtral" and model_type == "llava":  # Pixtral-12B
        return _pixtral(vision) + two_linears(_int(vision, "hidden_size", default=1024), text, bias=bias)
    if tower_type == "siglip_vision_model" and model_type != "llava":  # LLaVA-OneVision
        width = _int(vision, "hidden_size", default=768)
        return siglip(vision) + two_linears(width, text, bias=bias) + newline
    return None
