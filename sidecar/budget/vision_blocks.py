"""The pieces several vision towers share: SigLIP's encoder, a CLIP-like layer, LLaVA's two-linear projector.

Each is transformers 5.19's module tree, term by term, with the defaults of the config class named; the
families in :mod:`sidecar.budget.vision`, :mod:`sidecar.budget.vision_llava` and
:mod:`sidecar.budget.vision_video` build on them, and the tests check every family that does against the
model transformers builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.budget.config_fields import int_field as _int


def siglip(vision: Mapping[str, Any]) -> int:
    """A SigLIP tower (``SiglipVisionModel``; defaults: ``SiglipVisionConfig``'s), without a projector.

    SigLIP 2 (``Siglip2VisionModel``) differs in what counts the same: a linear patch embedding with a bias
    where SigLIP has a Conv2d with one, and ``num_patches`` positions where SigLIP has the image's grid. The
    attention-pooling head (a probe, an attention, a LayerNorm, an MLP) unless ``vision_use_head`` is false.
    """
    width = _int(vision, "hidden_size", default=768)
    inner = _int(vision, "intermediate_size", default=3072)
    patch, image = _int(vision, "patch_size", default=16), _int(vision, "image_size", default=224)
    embeddings = _int(vision, "num_channels", default=3) * patch * patch * width + width
    positions = _int(vision, "num_patches") if vision.get("model_type") == "siglip2_vision_model" else 0
    embeddings += (positions or (image // patch) ** 2) * width
    mlp = 2 * width * inner + inner + width
    layer = 4 * (width * width + width) + 2 * 2 * width + mlp
    head = width + 3 * (width * width + width) + width * width + width + 2 * width + mlp  # probe, attention
    if vision.get("vision_use_head", True) is False:
        head = 0
    layers = _int(vision, "num_hidden_layers", default=12)
    return embeddings + layers * layer + 2 * width + head


def headless_siglip(vision: Mapping[str, Any], defaults: Mapping[str, int], *, siglip2: bool = False) -> int:
    """A SigLIP (or SigLIP 2) tower without the attention-pooling head, with its family's own defaults."""
    model_type = "siglip2_vision_model" if siglip2 else "siglip_vision_model"
    return siglip({**defaults, **vision, "model_type": model_type, "vision_use_head": False})


def clip_layer(width: int, inner: int) -> int:
    """A CLIP-like encoder layer: q/k/v/out projections and fc1/fc2 with biases, two LayerNorms."""
    return 4 * (width * width + width) + 2 * width * inner + inner + width + 4 * width


def two_linears(width: int, text_hidden: int, *, bias: bool) -> int:
    """LLaVA's projector (``LlavaMultiModalProjector``): ``width -> text``, ``text -> text``."""
    return width * text_hidden + text_hidden * text_hidden + (2 * text_hidden if bias else 0)
