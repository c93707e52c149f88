"""Parameters of a multimodal checkpoint's vision tower and projector, from its ``config.json``.

vLLM loads the vision encoder onto the GPU with the language model, so its weights count against
the budget (Qwen2-VL-7B: 0.68B of its 8.29B). Each layout below is transformers' module tree for
the family, term by term, and the tests check each against the model transformers builds
(``tests/data/hf-configs/transformers-reference.json`` for the corpus configs, the defaults sweep's
``tests/data/transformers-defaults-sweep.json`` for every family vLLM 0.32 serves, and
``tests/data/vision-tower-variants.json`` for configs that change each field a tower reads). The towers
that embed video (the Qwen-VL line, ERNIE 4.5-VL, GLM, EXAONE 4.5, MiniMax-M3, Muse, Nemotron-H Omni) are in
:mod:`sidecar.budget.vision_video`; the image towers here:

* ``blip-2`` (``Blip2VisionModel``, ``Blip2QFormerModel``): a ViT with a class token, q/k/v in one
  projection (a bias unless ``qkv_bias`` is false), ``num_query_tokens`` learned queries, a Q-Former of
  BERT-like layers with a cross-attention to the ViT every ``cross_attention_frequency`` layers (and a
  second feed-forward with ``use_qformer_text_input``, which vLLM 0.32.0 never builds), and a projection;
* ``step3p7`` (``Step3p7VisionModel``): a Conv2d patch embedding without bias, positions, a pre-LayerNorm,
  CLIP-like layers with two layer scales, two 3 x 3 downsampling convolutions and a projection from
  ``4 x hidden`` (the legacy ``width`` and ``layers`` win, as transformers reads them);
* ``deepseek_v41``: vLLM 0.32.0's own ViT and aligner (transformers has no class to compare with);
* ``paligemma``: a SigLIP tower (below) and one linear with a bias to ``projection_dim``; ``shieldgemma2``
  is Gemma 3's tower and projector;
* SigLIP-like towers without the attention-pooling head, each with its own defaults: ``paddleocr_vl``
  (``PaddleOCRVisionModel``; its projector a LayerNorm and two linears with biases over the merged width),
  ``cosmos3_edge`` (SigLIP 2's linear patches; ``Cosmos3EdgePatchMerger``: a LayerNorm and two linears with
  biases through ``projector_hidden_size``), ``aria`` (Idefics3's tower; ``AriaProjector``: a query table of
  the largest ``projector_patch_to_query_dict`` value, or the stored
  ``max_value_projector_patch_to_query_dict``, a cross-attention of q/k/v without bias, a
  ``MultiheadAttention`` and a linear with a bias, three LayerNorms, and two linears without bias to the
  text width; vLLM 0.32.0's ``aria.py`` skips the post-LayerNorm, 2 x width fewer), ``idefics3`` and
  ``smolvlm`` (Idefics3's tower; the connector, one linear without bias from the ``scale_factor^2``
  pixel-shuffled width) and ``minicpmv4_6`` /
  ``minicpmv4_7`` (``ViTWindowAttentionMerger``: an attention, a LayerNorm and an MLP over
  ``window_kernel_size`` windows; then ``merger_times`` merger MLPs, the last to the text width; vLLM
  0.32.0 builds one merger, and drops the last encoder layer with ``drop_vision_last_layer``);
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

* ``gemma3`` (``SiglipVisionModel`` and ``Gemma3MultiModalProjector``, transformers 5.19): Conv2d patches
  with a bias and ``(image_size // patch_size)^2`` position embeddings, layers of q/k/v/out projections with
  biases, two LayerNorms and fc1/fc2 with biases, a post-LayerNorm, the attention-pooling head unless
  ``vision_use_head`` is false (the published Gemma 3 configs say false), and the projector
  (``vision hidden x text hidden`` and an RMSNorm of the vision width);
* ``gemma4``: its vision tower and, with an ``audio_config`` (E2B, E4B), its audio tower
  (:func:`sidecar.budget.gemma4.gemma4_towers`);

* ``internvl`` (``InternVLVisionModel`` and ``InternVLMultiModalProjector``, transformers 5.19): a class
  token, Conv2d patches with a bias and absolute positions, layers of q/k/v (biases with ``attention_bias``),
  an output projection with a bias, optional q/k RMSNorms, fc1/fc2 with biases, two norms (``norm_type``)
  and two layer scales; a final LayerNorm unless mean pooling; the projector's LayerNorm over the pixel-
  shuffled width (``downsample_ratio``) and two linears with biases to the text width; ``qianfan_ocr``
  (``QianfanOCRVisionModel``) is the same tree, with q/k/v biases by default, and so is InternVL's original
  layout (``internvl_chat``: InternViT's ``qkv_bias`` and ``qk_normalization``, the ``mlp1`` projector, the
  language model under ``llm_config``; vLLM 0.32.0 ``internvl.py`` and ``intern_vit.py``);
* ``cohere2_vision`` (``Cohere2VisionModel``, transformers 5.19): a SigLIP tower with its attention-pooling
  head unless ``vision_use_head`` is false, and the projector over pixel-shuffled features: a linear with a
  bias to ``alignment_intermediate_size`` and, after its SwiGLU halves it, one to the text width;
* ``lfm2_vl`` (``Lfm2VlModel``, transformers 5.19): a SigLIP 2 tower and, over pixel-shuffled features,
  an optional LayerNorm and two linears (``projector_hidden_size``, then the text width; ``projector_bias``);
* ``mllama`` (``MllamaVisionModel``, transformers 5.19 ``models/mllama/modeling_mllama.py``; vLLM served
  it natively until 0.10.2, its 0.32.0 registry says (``_PREVIOUSLY_SUPPORTED_MODELS``), and from then on
  resolves it to its Transformers backend, which builds transformers' modules, as transformers 5.19 reports
  the class backend-compatible: read in source, not run): a Conv2d patch embedding
  without bias, the class embedding, the gated position embedding (``(image_size // patch_size)^2 + 1``
  positions) and its per-aspect-ratio tile table (``supported_aspect_ratios + 1`` rows of ``max_num_tiles x
  positions x hidden``), two gated per-tile embeddings, pre- and post-LayerNorm, ``num_hidden_layers`` local
  and ``num_global_layers`` gated global layers (q/k/v/o without bias, fc1/fc2 with biases, two LayerNorms),
  and the projector ``vision_output_dim -> text hidden`` with a bias. Llama-3.2-90B-Vision: 926,490,131, as
  transformers builds it.

Other multimodal families return ``None``: their towers are counted exactly only from
the weights' safetensors headers (a cached checkpoint or the Hub's metadata), and ``plan`` names what a count
from ``config.json`` leaves out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sidecar.budget.config_fields import int_field as _int
from sidecar.budget.gemma4 import gemma4_towers
from sidecar.budget.vision_blocks import clip_layer, headless_siglip, siglip, two_linears
from sidecar.budget.vision_llava import LLAVA_TYPES, llava_family
from sidecar.budget.vision_video import VIDEO_TOWERS

MLLAMA_ASPECT_RATIOS = 8
"""``MllamaVisionConfig``'s default ``supported_aspect_ratios``: the eight tile layouts up to four tiles."""


def _paligemma(vision: Mapping[str, Any], text_hidden: int) -> int:
    """PaliGemma: a SigLIP tower and one linear with a bias to ``projection_dim`` (the text width)."""
    projection = _int(vision, "projection_dim", default=2048)
    return siglip(vision) + _int(vision, "hidden_size", default=768) * projection + projection


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


def _siglip_gemma3(vision: Mapping[str, Any], text_hidden: int) -> int:
    """Gemma 3's SigLIP tower and projector (an RMSNorm of the vision width, a linear without bias)."""
    width = _int(vision, "hidden_size", default=768)
    return siglip(vision) + width * text_hidden + width


def _side(cfg: Mapping[str, Any], key: str, default: int) -> int:
    """A size given as one number or as ``[height, width]`` (square in every published config)."""
    value = cfg.get(key)
    if isinstance(value, list) and value and isinstance(value[0], int):
        return int(value[0])
    return _int(cfg, key, default=default)


def _internvl(
    config: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int, *, qkv_bias_default: bool = False
) -> int:
    hidden, width = _int(vision, "hidden_size", default=1024), _int(vision, "intermediate_size", default=4096)
    patch, image = _side(vision, "patch_size", 14), _side(vision, "image_size", 448)
    norm = 2 * hidden if vision.get("norm_type", "layer_norm") == "layer_norm" else hidden
    embed = hidden + _int(vision, "num_channels", default=3) * patch * patch * hidden + hidden  # cls, patches
    if vision.get("use_mask_token"):
        embed += hidden
    if vision.get("use_absolute_position_embeddings", True):
        embed += ((image // patch) ** 2 + 1) * hidden
    qkv_bias = 3 * hidden if vision.get("attention_bias", qkv_bias_default) else 0
    layer = 3 * hidden * hidden + qkv_bias + hidden * hidden + hidden
    layer += (2 * hidden if vision.get("use_qk_norm") else 0) + 2 * hidden * width + width + hidden
    layer += 2 * norm + 2 * hidden  # the norms before and after, the two layer scales
    final = 0 if vision.get("use_mean_pooling", True) else 2 * hidden
    ratio = config.get("downsample_ratio", 0.5)
    merged = hidden * round(1 / ratio) ** 2 if isinstance(ratio, int | float) and ratio > 0 else 4 * hidden
    projector = 2 * merged + two_linears(merged, text_hidden, bias=True)  # a LayerNorm, then LLaVA's two
    return embed + _int(vision, "num_hidden_layers", default=24) * layer + final + projector


def _internvl_chat(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    """InternVL's original layout: InternViT under its own field names, and ``mlp1``.

    ``InternVisionConfig``: no q/k/v bias, no q/k norms, RMSNorms unless the config says; vLLM 0.32.0 builds
    ``num_hidden_layers + select_layer + 1`` layers for a negative ``select_layer``
    (``InternVLChatModel._init_vision_model``).
    """
    layers, select = _int(vision, "num_hidden_layers", default=24), top.get("select_layer", -1)
    if isinstance(select, int) and not isinstance(select, bool):
        layers = layers + select + 1 if select < 0 else select + 1
    renamed = {"norm_type": "rms_norm", **vision, "num_hidden_layers": layers}
    renamed |= {
        "attention_bias": vision.get("qkv_bias", False),
        "use_qk_norm": vision.get("qk_normalization"),
    }
    return _internvl(top, renamed, text_hidden)


def _cohere2_vision(config: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    """Command A Vision: a SigLIP tower (its head too, by default) and the pixel-shuffle projector."""
    factor = _int(config, "downsample_factor", default=2)
    inner = _int(config, "alignment_intermediate_size", default=36864)
    shuffled = _int(vision, "hidden_size", default=768) * factor * factor
    halved = inner // 2  # the SwiGLU between the two linears halves the width
    return siglip(vision) + shuffled * inner + inner + halved * text_hidden + text_hidden


def _lfm2_vl(config: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    """LFM2-VL: a SigLIP 2 tower (its head too, by default) and the pixel-shuffle projector."""
    factor = _int(config, "downsample_factor", default=2)
    shuffled = _int(vision, "hidden_size", default=768) * factor * factor
    inner = _int(config, "projector_hidden_size", default=2560)
    bias = 1 if config.get("projector_bias", True) else 0
    norm = 2 * shuffled if config.get("projector_use_layernorm", True) else 0
    return siglip(vision) + norm + shuffled * inner + bias * inner + inner * text_hidden + bias * text_hidden


def _mllama(vision: Mapping[str, Any], text_hidden: int) -> int:
    hidden, width = _int(vision, "hidden_size", default=1280), _int(vision, "intermediate_size", default=5120)
    patch, image = _int(vision, "patch_size", default=14), _int(vision, "image_size", default=448)
    tiles, channels = _int(vision, "max_num_tiles", default=4), _int(vision, "num_channels", default=3)
    ratios = vision.get("supported_aspect_ratios")
    aspect_rows = (len(ratios) if isinstance(ratios, list) else MLLAMA_ASPECT_RATIOS) + 1
    positions = (image // patch) ** 2 + 1
    embeddings = channels * patch * patch * hidden + hidden + 1 + positions * hidden
    embeddings += aspect_rows * tiles * positions * hidden + 2 * (aspect_rows * tiles * hidden + 1)
    layer = 4 * hidden * hidden + 2 * hidden * width + width + hidden + 4 * hidden
    local = _int(vision, "num_hidden_layers", default=32) * layer
    global_ = _int(vision, "num_global_layers", default=8) * (layer + 2)  # gated: two scalar gates each
    projector = _int(vision, "vision_output_dim", default=7680) * text_hidden + text_hidden
    return embeddings + 4 * hidden + local + global_ + projector


_SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27}  # SigLIP so400m's shape
PADDLEOCR_VISION = {**_SO400M, "patch_size": 14, "image_size": 384}
"""``PaddleOCRVisionConfig``'s defaults where SigLIP's differ."""
COSMOS3_EDGE_VISION = {**_SO400M, "num_patches": 256}
"""``Cosmos3EdgeVisionConfig``'s defaults where SigLIP 2's differ."""
IDEFICS3_VISION = {"hidden_size": 1152, "num_hidden_layers": 12, "patch_size": 32}
"""``Idefics3VisionConfig``'s defaults where SigLIP's differ (Aria's tower)."""
ARIA_QUERIES = 256
"""The largest value in ``AriaConfig``'s default ``projector_patch_to_query_dict``: {1225: 128, 4900: 256}."""


def _paddleocr_vl(_top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    width = _int(vision, "hidden_size", default=1152)
    merged = width * _int(vision, "spatial_merge_size", default=2) ** 2
    projector = 2 * width + merged * merged + merged + merged * text_hidden + text_hidden
    return headless_siglip(vision, PADDLEOCR_VISION) + projector


def _cosmos3_edge(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    width = _int(vision, "hidden_size", default=1152)
    inner = _int(top, "projector_hidden_size", default=11520)
    merged = width * _int(vision, "spatial_merge_size", default=2) ** 2
    projector = 2 * width + merged * inner + inner + inner * text_hidden + text_hidden
    return headless_siglip(vision, COSMOS3_EDGE_VISION, siglip2=True) + projector


def _aria(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    width = _int(vision, "hidden_size", default=1152)
    table = top.get("projector_patch_to_query_dict")
    counts = [v for v in table.values() if isinstance(v, int)] if isinstance(table, Mapping) else []
    queries = _int(top, "max_value_projector_patch_to_query_dict", default=max(counts, default=ARIA_QUERIES))
    cross = 3 * width * width + 4 * width * width + 4 * width + width * width + width + 4 * width
    projector = queries * width + cross + 2 * width + width * text_hidden + text_hidden * text_hidden
    return headless_siglip(vision, IDEFICS3_VISION) + projector


def _idefics3(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    """Idefics3 and SmolVLM: Idefics3's tower and the connector over ``scale_factor^2`` shuffled patches."""
    shuffled = _int(vision, "hidden_size", default=1152) * _int(top, "scale_factor", default=2) ** 2
    return headless_siglip(vision, IDEFICS3_VISION) + shuffled * text_hidden


def _minicpmv4_6(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    """MiniCPM-V 4.6 and 4.7: SigLIP's tower and defaults, the window merger and the merger MLPs."""
    width, inner = _int(vision, "hidden_size", default=768), _int(vision, "intermediate_size", default=3072)
    window = vision.get("window_kernel_size")
    cells = 4  # MiniCPMV4_6VisionConfig: (2, 2)
    if isinstance(window, list) and len(window) == 2 and all(isinstance(v, int) for v in window):
        cells = window[0] * window[1]
    attention = 4 * (width * width + width)
    window_merger = attention + 2 * width + 2 * cells * width + cells * width * cells * inner + cells * inner
    window_merger += cells * inner * width + width

    def merger(out: int) -> int:  # a LayerNorm over four patches, a square linear, a linear to ``out``
        return 2 * 4 * width + 16 * width * width + 4 * width + 4 * width * out + out

    extra = _int(top, "merger_times", default=1) - 1
    return headless_siglip(vision, {}) + window_merger + extra * merger(width) + merger(text_hidden)


def _blip2(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    """BLIP-2: its ViT (``Blip2VisionConfig``'s defaults), the query tokens, the Q-Former, the projection."""
    width, inner = _int(vision, "hidden_size", default=1408), _int(vision, "intermediate_size", default=6144)
    patch, image = _int(vision, "patch_size", default=14), _int(vision, "image_size", default=224)
    qkv_bias = 3 * width if vision.get("qkv_bias", True) else 0  # one 3 x width bias, the K slice zero
    embeddings = width + 3 * patch * patch * width + width + ((image // patch) ** 2 + 1) * width
    layer = 4 * width * width + qkv_bias + width + 2 * width * inner + inner + width + 4 * width
    tower = embeddings + _int(vision, "num_hidden_layers", default=39) * layer + 2 * width
    qformer = top.get("qformer_config")
    qformer = qformer if isinstance(qformer, Mapping) else {}
    hidden, q_inner = (
        _int(qformer, "hidden_size", default=768),
        _int(qformer, "intermediate_size", default=3072),
    )
    layers, every = (
        _int(qformer, "num_hidden_layers", default=12),
        _int(qformer, "cross_attention_frequency", default=2),
    )
    feed_forward = 2 * hidden * q_inner + q_inner + hidden + 2 * hidden
    feed_forwards = 2 if qformer.get("use_qformer_text_input") is True else 1
    attention = 4 * (hidden * hidden + hidden) + 2 * hidden
    cross = 2 * (hidden * hidden + hidden) + 2 * (width * hidden + hidden) + 2 * hidden  # keys from the ViT
    qformer_total = (
        2 * hidden + layers * (attention + feed_forwards * feed_forward) + -(-layers // every) * cross
    )
    queries = _int(top, "num_query_tokens", default=32) * hidden
    return tower + queries + qformer_total + hidden * text_hidden + text_hidden


def _step3p7(top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    """Step 3.7's tower (``intermediate_size`` is always ``hidden x mlp_ratio``) and its projector."""
    width, layers = (
        _int(vision, "width", "hidden_size", default=1536),
        _int(vision, "layers", "num_hidden_layers", default=47),
    )
    ratio = vision.get("mlp_ratio")
    inner = int(width * (ratio if isinstance(ratio, float) else 8960 / 1536))
    patch, image = _int(vision, "patch_size", default=14), _int(vision, "image_size", default=728)
    embeddings = (
        _int(vision, "num_channels", default=3) * patch * patch * width + (image // patch) ** 2 * width
    )
    layer = clip_layer(width, inner) + 2 * width  # and two layer scales
    downsamplers = 9 * width * 2 * width + 2 * width + 9 * 2 * width * 4 * width + 4 * width  # 3 x 3 convs
    projector = 4 * width * text_hidden + (text_hidden if top.get("projector_bias") is True else 0)
    return embeddings + 2 * width + layers * layer + downsamplers + projector


def _deepseek_v41(_top: Mapping[str, Any], vision: Mapping[str, Any], text_hidden: int) -> int:
    """DeepSeek-V4.1's ViT and aligner as vLLM 0.32.0 builds them (no transformers class exists).

    ``DeepseekV4ViT``, ``DeepseekV4Aligner`` (``vllm/models/deepseek_v4/common/vision.py``) and the image
    start, end and newline vectors (``nvidia/vl_model.py``), with ``DeepseekV41Config``'s defaults: a linear
    patch embedding with a bias, blocks of two RMSNorms, q/k/v and output with biases and a gated MLP without,
    a final norm, and two linears with biases from the ``downsample_ratio^2``-merged width to the text's.
    """
    width, inner = _int(vision, "hidden_size", default=1024), _int(vision, "intermediate_size", default=2816)
    patch, ratio = _int(vision, "patch_size", default=14), _int(vision, "downsample_ratio", default=3)
    block = 2 * width + 4 * width * width + 4 * width + 3 * width * inner
    embed = 3 * patch * patch * width + width
    aligner = width * ratio * ratio * text_hidden + text_hidden + text_hidden * text_hidden + text_hidden
    return embed + _int(vision, "num_hidden_layers", default=0) * block + width + aligner + 3 * text_hidden


_TOWERS: dict[str, Callable[[Mapping[str, Any], int], int]] = {
    "llama4": _llama4,
    "gemma3": _siglip_gemma3,
    "shieldgemma2": _siglip_gemma3,  # ShieldGemma 2: Gemma 3's tower and projector
    "mllama": _mllama,
    "paligemma": _paligemma,
}
"""The image towers read from ``vision_config`` alone, by the top config's ``model_type``."""
_TOWERS_READING_THE_TOP_LEVEL: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any], int], int]] = {
    "internvl": _internvl,  # downsample_ratio
    "internvl_chat": _internvl_chat,  # downsample_ratio, select_layer
    "qianfan_ocr": lambda top, vision, text: _internvl(top, vision, text, qkv_bias_default=True),
    "cohere2_vision": _cohere2_vision,  # downsample_factor, alignment_intermediate_size
    "lfm2_vl": _lfm2_vl,  # downsample_factor, projector_hidden_size, its bias and LayerNorm
    "paddleocr_vl": _paddleocr_vl,
    "cosmos3_edge": _cosmos3_edge,  # projector_hidden_size
    "aria": _aria,  # the query table's size
    "idefics3": _idefics3,  # scale_factor
    "smolvlm": _idefics3,
    "minicpmv4_6": _minicpmv4_6,  # merger_times
    "minicpmv4_7": _minicpmv4_6,
    "gemma4": lambda top, _, text_hidden: gemma4_towers(top, text_hidden),  # audio_config too
    "blip-2": _blip2,  # qformer_config, num_query_tokens
    "step3p7": _step3p7,  # projector_bias
    "deepseek_v41": _deepseek_v41,  # the text width: its aligner projects to it
    **VIDEO_TOWERS,
}
"""The towers that read the top config too (image towers with top-level projector fields, and every video
tower), by the top config's ``model_type``."""


def vision_parameters(config: Mapping[str, Any], text_hidden: int) -> int | None:
    """The vision tower's and projector's parameters, ``0`` for a text model, ``None`` when not modelled."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return 0
    model_type = str(config.get("model_type") or "")
    if model_type in LLAVA_TYPES:
        return llava_family(model_type, config, vision, text_hidden)
    with_top = _TOWERS_READING_THE_TOP_LEVEL.get(model_type)  # projectors sized by top-level fields
    if with_top:
        return with_top(config, vision, text_hidden)
    tower = _TOWERS.get(model_type)
    return tower(vision, text_hidden) if tower else None
