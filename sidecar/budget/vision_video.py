"""Vision towers that embed video: patches over ``temporal_patch_size`` frames, then a patch merger.

The Qwen-VL line and the towers built after it (ERNIE 4.5-VL, GLM, EXAONE, MiniMax, Muse), and Nemotron-H
Omni's RADIO tower with its video projection and optional audio encoder. Each function is transformers 5.19's
module tree for the family, term by term, read from its ``modeling_<family>.py`` with the defaults of its
``configuration_<family>.py``; the tests check each against the model transformers builds on the ``meta``
device, for the family's default config and for configs that change every field the function reads
(``tests/unit/test_defaults_sweep.py``, ``tests/unit/test_vision_towers.py``). vLLM 0.32.0 loads the same
tensors under other names (fused QKV and gate/up projections) unless a family says otherwise:

* ``qwen2_vl``: Conv3d patch embedding (no bias), ``depth`` blocks of LayerNorm x 2, fused QKV and
  output projection, an ``mlp_ratio`` x MLP (fc1, fc2), and the patch merger (LayerNorm, two linears);
* ``qwen2_5_vl``: the same with RMSNorms and a gated MLP of ``intermediate_size``;
* ``exaone4_5`` (``Exaone4_5_VisionModel``): Qwen2.5-VL's tower with grouped KV heads
  (``num_key_value_heads``) and biases on the gated MLP; its merger ends at ``out_hidden_size``;
* ``qwen3_vl`` and ``qwen3_5`` (``Qwen3VLVisionModel``, ``Qwen3_5VisionModel``): a Conv3d
  patch embedding with a bias, ``num_position_embeddings`` learned positions, ``depth`` blocks of two
  LayerNorms, fused QKV and output projection with biases and fc1/fc2 with biases, the patch merger
  (LayerNorm of the vision width, ``hidden x merge^2`` square linear, linear to ``out_hidden_size``,
  biases), and for Qwen3-VL one more merger per ``deepstack_visual_indexes`` entry (its LayerNorm over the
  merged width; default three); Qwen3.5's tower has none. The MoE variants share the tower;
* ``ernie4_5_vl_moe`` (``Ernie4_5_VLMoeVisionTransformerPretrainedModel`` and
  ``Ernie4_5_VLMoeVariableResolutionResamplerModel``): a linear patch embedding without bias, blocks of two
  LayerNorms, fused QKV and output projection and fc1/fc2 with biases, a final LayerNorm; the resampler's
  spatial and temporal (``temporal_merge_size`` frames) MLPs over the merged width, each with a LayerNorm,
  the projection to the text width and an RMSNorm. The language model's image experts are the language
  model's. vLLM 0.32.0's ``ernie45_vl.py`` builds the same shapes from Baidu's own config names;
* ``glm4v`` and ``glm4v_moe`` (``Glm4vVisionModel``): learned positions of the
  ``image_size`` grid, a Conv3d patch embedding with a bias, ``depth`` blocks of two RMSNorms, fused QKV
  (a bias with ``attention_bias``), an output projection and a gated MLP of ``out_hidden_size`` without
  biases; the merger (a square projection of ``out_hidden_size``, a LayerNorm and a gated MLP of
  ``intermediate_size``), two RMSNorms and the Conv2d downsample (``spatial_merge_size`` kernel, a bias);
* ``glm_ocr`` and ``glm5_next`` (``GlmOcrVisionModel``, ``Glm5NextVisionModel``): no learned positions,
  blocks with q and k RMSNorms of the head size and a gated MLP of ``intermediate_size``, biases on both
  with ``attention_bias`` (default true); the merger's gated MLP is ``out_hidden_size x in_channels`` wide
  for GLM-OCR (vLLM 0.32.0's ``glm_ocr.py`` sizes it by the text ``intermediate_size``: a checkpoint
  loads in both only where the two agree) and ``projection_intermediate_size`` for GLM-5-Next;
* ``minimax_m3_vl`` (``MiniMaxM3VLVisionModel``, ``MiniMaxM3VLMultiModalProjector``): a Conv3d without
  bias, a pre-LayerNorm, CLIP-like layers, and a projector of four linears with biases (the tower's width
  and the merged text width, ``merged_hidden_size``, each to ``projector_hidden_size``, then to the text);
* ``muse_glimmer`` (``MuseGlimmerVisionModel``, ``MuseGlimmerVisionAdapter``): a linear patch embedding
  of ``patch_temporal x 3 x patch^2`` without bias, a ``pos_emb_height x pos_emb_width`` table, pre- and
  post-LayerNorms, CLIP-like layers, the adapter's two linears and the projection, all without bias;
* ``nemotron_h_omni`` (``RadioModel`` in ``models/radio``, the projector of ``modeling_nemotron_h_omni.py``;
  vLLM 0.32.0 serves the original NVIDIA layout, ``nano_nemotron_vl.py``, whose projector, final norm and
  audio encoder have these shapes but whose RADIO size comes from the timm model name): patch and video
  patch projections, an ``(max_img_size // patch)^2`` position table and the class and register tokens,
  layers of two LayerNorms, q/k/v (``qkv_bias``) and an output projection with a bias, two layer scales and
  an MLP (SwiGLU with ``use_swiglu_ffn``); a final LayerNorm when the text model has MTP layers; the
  projector (an RMSNorm and two linears without bias over the pixel-shuffled width); and with an
  ``audio_config`` (``sound_config``) a Parakeet encoder (``models/parakeet``) and its projector.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sidecar.budget.config_fields import as_number
from sidecar.budget.config_fields import int_field as _int
from sidecar.budget.vision_blocks import clip_layer

QWEN3_VL_DEEPSTACK_MERGERS = 3
"""``Qwen3VLVisionConfig``'s default ``deepstack_visual_indexes``: (8, 16, 24), one merger each."""


def _qwen_vl(vision: Mapping[str, Any], text_hidden: int, *, gated: bool) -> int:
    width = _int(vision, "embed_dim", "hidden_size", default=1280)
    depth = _int(vision, "depth", default=32)
    patch, temporal = _int(vision, "patch_size", default=14), _int(vision, "temporal_patch_size", default=2)
    merge = _int(vision, "spatial_merge_size", default=2)
    out = _int(vision, *(("out_hidden_size",) if gated else ()), "hidden_size", default=text_hidden)
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


def _exaone4_5(vision: Mapping[str, Any]) -> int:
    width, inner = _int(vision, "hidden_size", default=3584), _int(vision, "intermediate_size", default=3420)
    heads = _int(vision, "num_heads", "num_attention_heads", default=16)
    kv_heads, head_dim = _int(vision, "num_key_value_heads", default=8), width // heads
    patch, temporal = _int(vision, "patch_size", default=14), _int(vision, "temporal_patch_size", default=2)
    merged = width * _int(vision, "spatial_merge_size", default=2) ** 2
    out = _int(vision, "out_hidden_size", default=3584)
    qkv = (heads + 2 * kv_heads) * head_dim
    block = 2 * width + width * qkv + qkv + width * width + width + 3 * width * inner + 2 * inner + width
    merger = width + merged * merged + merged + merged * out + out
    embed = _int(vision, "in_channels", default=3) * temporal * patch * patch * width
    return embed + _int(vision, "depth", default=32) * block + merger


def _qwen3_vl(vision: Mapping[str, Any], deepstack_default: int) -> int:
    hidden, width = _int(vision, "hidden_size", default=1152), _int(vision, "intermediate_size", default=4304)
    patch, temporal = _int(vision, "patch_size", default=16), _int(vision, "temporal_patch_size", default=2)
    merged = hidden * _int(vision, "spatial_merge_size", default=2) ** 2
    out = _int(vision, "out_hidden_size", default=3584)
    embed = _int(vision, "in_channels", default=3) * temporal * patch * patch * hidden + hidden
    positions = _int(vision, "num_position_embeddings", default=2304) * hidden
    block = 4 * hidden + 3 * hidden * hidden + 3 * hidden + hidden * hidden + hidden + 2 * hidden * width
    block += width + hidden
    merger = merged * merged + merged + merged * out + out  # two linears with biases, after the norm
    indexes = vision.get("deepstack_visual_indexes")
    deepstack = len(indexes) if isinstance(indexes, list) else deepstack_default
    blocks = _int(vision, "depth", default=27) * block
    return embed + positions + blocks + merger + 2 * hidden + deepstack * (merger + 2 * merged)


def _ernie4_5_vl_moe(vision: Mapping[str, Any], text_hidden: int) -> int:
    """ERNIE 4.5-VL's tower and resampler (defaults: ``Ernie4_5_VLMoeVisionConfig``'s)."""
    width = _int(vision, "hidden_size", default=1280)
    inner = _int(vision, "intermediate_size", default=4 * width)
    patch = _int(vision, "patch_size", default=14)
    block = 4 * width + 4 * width * width + 4 * width + 2 * width * inner + inner + width
    tower = _int(vision, "in_channels", default=3) * patch * patch * width
    tower += _int(vision, "depth", default=32) * block + 2 * width
    merged = width * _int(vision, "spatial_merge_size", default=2) ** 2
    temporal = _int(vision, "temporal_merge_size", default=2)
    spatial = 2 * (merged * merged + merged) + 2 * merged
    over_time = merged * temporal * merged + merged + merged * merged + merged + 2 * merged
    return tower + spatial + over_time + merged * text_hidden + 2 * text_hidden  # the MLP and the RMSNorm


def _glm4v(vision: Mapping[str, Any]) -> int:
    hidden = _int(vision, "hidden_size", default=1536)
    width = _int(vision, "intermediate_size", default=13696)
    out, merge = _int(vision, "out_hidden_size", default=4096), _int(vision, "spatial_merge_size", default=2)
    patch, temporal = _int(vision, "patch_size", default=14), _int(vision, "temporal_patch_size", default=2)
    positions = (_int(vision, "image_size", default=336) // patch) ** 2 * hidden
    embed = _int(vision, "in_channels", default=3) * temporal * patch * patch * hidden + hidden
    qkv_bias = 3 * hidden if vision.get("attention_bias") else 0
    block = 2 * hidden + 3 * hidden * hidden + qkv_bias + hidden * hidden + 3 * hidden * out  # MLP of out
    merger = out * out + 2 * out + 3 * out * width
    downsample = hidden * out * merge * merge + out
    return positions + embed + _int(vision, "depth", default=24) * block + merger + 2 * hidden + downsample


def _glm_ocr(vision: Mapping[str, Any], merger_width: int) -> int:
    """GLM-OCR's and GLM-5-Next's tower (defaults: ``GlmOcrVisionConfig``'s, which GLM-5-Next's repeats)."""
    hidden, inner = _int(vision, "hidden_size", default=1024), _int(vision, "intermediate_size", default=4096)
    out, merge = _int(vision, "out_hidden_size", default=1536), _int(vision, "spatial_merge_size", default=2)
    patch, temporal = _int(vision, "patch_size", default=14), _int(vision, "temporal_patch_size", default=2)
    head_dim = hidden // _int(vision, "num_heads", default=16)
    bias = 1 if vision.get("attention_bias", True) else 0
    attention = 4 * hidden * hidden + bias * 4 * hidden + 2 * head_dim  # fused qkv, proj, q and k norms
    block = 2 * hidden + attention + 3 * hidden * inner + bias * (2 * inner + hidden)
    embed = _int(vision, "in_channels", default=3) * temporal * patch * patch * hidden + hidden
    merger = out * out + 2 * out + 3 * out * merger_width
    downsample = hidden * out * merge * merge + out
    return embed + _int(vision, "depth", default=24) * block + merger + downsample + hidden


def _glm_ocr_top(vision: Mapping[str, Any]) -> int:
    out = _int(vision, "out_hidden_size", default=1536)
    return _glm_ocr(vision, out * _int(vision, "in_channels", default=3))


def _glm5_next(_top: Mapping[str, Any], vision: Mapping[str, Any], _text_hidden: int) -> int:
    return _glm_ocr(vision, _int(vision, "projection_intermediate_size", default=10240))


def _minimax_m3_vl(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    width, inner = _int(vision, "hidden_size", default=1280), _int(vision, "intermediate_size", default=5120)
    patch, temporal = _int(vision, "patch_size", default=14), _int(vision, "temporal_patch_size", default=2)
    projector = _int(top, "projector_hidden_size", default=6144)
    merge = _int(vision, "spatial_merge_size", default=2)
    merged = _int(top, "merged_hidden_size", default=text_hidden * merge * merge)  # as stored, if stored
    tower = _int(vision, "num_channels", default=3) * temporal * patch * patch * width + 2 * width
    tower += _int(vision, "num_hidden_layers", default=32) * clip_layer(width, inner)
    linears = (width + merged) * projector + 2 * projector + 2 * (projector * text_hidden + text_hidden)
    return tower + linears


def _muse_glimmer(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    width, inner = _int(vision, "hidden_size", default=1536), _int(vision, "intermediate_size", default=8960)
    patch, temporal = _int(vision, "patch_size", default=14), _int(vision, "patch_temporal", default=2)
    positions = _int(vision, "pos_emb_height", default=32) * _int(vision, "pos_emb_width", default=32)
    out = _int(top, "out_hidden_size", default=6144)
    projector = _int(top, "projector_hidden_size", default=4096)
    tower = temporal * 3 * patch * patch * width + positions * width + 4 * width
    tower += _int(vision, "num_hidden_layers", default=50) * clip_layer(width, inner)
    return tower + out * projector + projector * projector + projector * text_hidden


def _radio(vision: Mapping[str, Any]) -> int:
    """RADIO (``RadioConfig``'s defaults), with its video patch projection."""
    width, heads = _int(vision, "hidden_size", default=1280), _int(vision, "num_attention_heads", default=16)
    inner_width = heads * _int(vision, "head_dim", default=width // heads)
    patch = _int(vision, "patch_size", default=16)
    patch_dim = _int(vision, "num_channels", default=3) * patch * patch
    video = _int(vision, "video_temporal_patch_size", default=0)  # None by default: no video projection
    tokens = _int(vision, "num_cls_tokens", default=3) + _int(vision, "num_registers", default=7)
    positions = (_int(vision, "max_img_size", default=2048) // patch) ** 2
    embeddings = (1 + video) * patch_dim * width + positions * width
    inner = int(width * (as_number(vision.get("mlp_ratio")) or 4.0))
    if vision.get("use_swiglu_ffn", False):
        inner = (int(inner * 2 / 3) + 7) // 8 * 8
        mlp = 3 * width * inner + 2 * inner + width
    else:
        mlp = 2 * width * inner + inner + width
    qkv_bias = 3 * inner_width if vision.get("qkv_bias", True) else 0
    attention = 4 * width * inner_width + qkv_bias + width
    layers = _int(vision, "num_hidden_layers", default=32)
    return embeddings + tokens * width + layers * (6 * width + attention + mlp)  # two norms, two scales


def _parakeet(audio: Mapping[str, Any], text_hidden: int) -> int:
    """A Parakeet encoder (``ParakeetEncoderConfig``'s defaults, no attention bias here) and its projector."""
    width, layers = _int(audio, "hidden_size", default=1024), _int(audio, "num_hidden_layers", default=24)
    heads = _int(audio, "num_attention_heads", default=8)
    inner = _int(audio, "intermediate_size", default=4096)
    head_width = heads * _int(audio, "head_dim", default=width // heads)
    bias = bool(audio.get("attention_bias", False))
    kernel = _int(audio, "conv_kernel_size", default=9)
    channels = _int(audio, "subsampling_conv_channels", default=256)
    sub_kernel = _int(audio, "subsampling_conv_kernel_size", default=3)
    stride = _int(audio, "subsampling_conv_stride", default=2)
    stages = _int(audio, "subsampling_factor", default=8).bit_length() - 1  # log2
    mel = _int(audio, "num_mel_bins", default=80)
    conv = channels * sub_kernel * sub_kernel + channels
    subsampling = conv + (stages - 1) * (conv + channels * channels + channels)
    subsampling += channels * (mel // int(stride**stages)) * width + width
    feed_forward = 2 * width * inner + (inner + width if bias else 0)
    attention = 5 * width * head_width + 2 * head_width + (3 * head_width + width if bias else 0)
    conv_bias = 4 * width if audio.get("convolution_bias", True) else 0
    convolution = 3 * width * width + width * kernel + conv_bias
    block = 2 * feed_forward + attention + convolution + 2 * width + 10 * width  # BatchNorm, five LayerNorms
    projection = _int(audio, "projection_hidden_size")
    projector = width + width * projection + projection * text_hidden
    if audio.get("projection_bias"):
        projector += projection + text_hidden
    return subsampling + layers * block + projector


def _nemotron_h_omni(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    width = _int(top, "vision_hidden_size", "vit_hidden_size", default=1280)
    shuffled = width * int(1 / (as_number(top.get("downsample_ratio")) or 0.5)) ** 2
    projector_width = _int(top, "projector_hidden_size", default=4096)
    total = shuffled + shuffled * projector_width + projector_width * text_hidden + _radio(vision)
    text = top.get("text_config") or {}  # llm_config in the original layout, renamed as vLLM does
    if isinstance(text, Mapping) and _int(text, "num_nextn_predict_layers") > 0:
        total += 2 * width  # vision_final_layernorm
    audio = top.get("audio_config") or top.get("sound_config")
    return total + (_parakeet(audio, text_hidden) if isinstance(audio, Mapping) else 0)


VIDEO_TOWERS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any], int], int]] = {
    "qwen2_vl": lambda _, vision, text_hidden: _qwen_vl(vision, text_hidden, gated=False),
    "qwen2_5_vl": lambda _, vision, text_hidden: _qwen_vl(vision, text_hidden, gated=True),
    "exaone4_5": lambda _, vision, __: _exaone4_5(vision),
    "qwen3_vl": lambda _, vision, __: _qwen3_vl(vision, QWEN3_VL_DEEPSTACK_MERGERS),
    "qwen3_vl_moe": lambda _, vision, __: _qwen3_vl(vision, QWEN3_VL_DEEPSTACK_MERGERS),
    "qwen3_5": lambda _, vision, __: _qwen3_vl(vision, 0),
    "qwen3_5_moe": lambda _, vision, __: _qwen3_vl(vision, 0),
    "ernie4_5_vl_moe": lambda _, vision, text_hidden: _ernie4_5_vl_moe(vision, text_hidden),
    "glm4v": lambda _, vision, __: _glm4v(vision),
    "glm4v_moe": lambda _, vision, __: _glm4v(vision),
    "glm_ocr": lambda _, vision, __: _glm_ocr_top(vision),
    "glm5_next": _glm5_next,
    "minimax_m3_vl": _minimax_m3_vl,
    "muse_glimmer": _muse_glimmer,
    "nemotron_h_omni": _nemotron_h_omni,
}
"""The video-embedding towers modelled, by the top config's ``model_type``: ``(top, vision_config, text
hidden) -> parameters``."""
