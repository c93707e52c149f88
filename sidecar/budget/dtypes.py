"""Bytes per element for weights and for the KV cache.

Weights: bf16/fp16 take 2 bytes per parameter, fp8/int8 take 1, and int4 (AWQ, GPTQ and
similar) takes half a byte plus the group scales and zero points that quantisation stores
beside it. The first seed article budgets int4 at 0.55 bytes per parameter
("约 0.5 字节, 含量化开销实际按 0.55 估"); that figure is :data:`INT4_EFFECTIVE_BYTES`.

KV cache: ``auto`` follows the model's dtype (as vLLM does), bf16/fp16 take 2 bytes,
fp8 (any of vLLM's ``fp8``, ``fp8_e4m3``, ``fp8_e5m2``) and int8 take 1, int4 takes 0.5, and ``nvfp4``
(vLLM 0.32's FlashInfer NVFP4 KV: ``nvfp4_kv_cache_full_dim``, ``head/2 + head/16`` bytes a head for K and
for V, ``FlashInferBackend.customize_spec``) 0.5625.
"""

from __future__ import annotations

from typing import Final

from sidecar.errors import UsageError

INT4_EFFECTIVE_BYTES: Final = 0.55
"""Bytes per int4 parameter including quantisation scales (the seed's 0.55 estimate)."""

MXFP4_BYTES: Final = 4.25 / 8
"""MXFP4: 4-bit elements plus one 8-bit scale per 32 (OCP Microscaling), as gpt-oss ships its experts."""

NVFP4_BYTES: Final = 4.5 / 8
"""NVFP4: 4-bit E2M1 elements plus one FP8 scale per 16 (and one float32 scale a tensor, negligible)."""

WEIGHT_DTYPES: Final[dict[str, float]] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": INT4_EFFECTIVE_BYTES,
    "mxfp4": MXFP4_BYTES,  # of the MoE experts; the other weights stay bf16 (see the ledger)
    "nvfp4": NVFP4_BYTES,  # of the linear layers (ModelOpt NVFP4, compressed-tensors nvfp4-pack-quantized)
}
"""Bytes per parameter for each weight dtype the planner accepts."""
FLOAT_DTYPES: Final = frozenset({"fp32", "bf16", "fp16"})
"""Weight dtypes vLLM also stores the KV cache in when ``--kv-cache-dtype auto`` (``--dtype``)."""

KV_DTYPES: Final[dict[str, float]] = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "nvfp4": NVFP4_BYTES,  # FlashInfer: head/2 bytes of E2M1 pairs and head/16 FP8 scales, K and V alike
}
"""Bytes per KV-cache element for each explicit KV dtype (``auto`` resolves to the model dtype)."""

_ALIASES: Final[dict[str, str]] = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "fp8_inc": "fp8",
    "float8_e4m3fn": "fp8",
    "awq": "int4",
    "gptq": "int4",
    "w4a16": "int4",
    "w8a8": "int8",
    "nvfp4_4over6": "nvfp4",  # vLLM's NVFP4 KV with a scale search on SM100: the same pages
}


def normalise_dtype(name: str) -> str:
    """Map any spelling vLLM or Hugging Face uses (``bfloat16``, ``fp8_e4m3``, ``awq``) to ours."""
    lowered = name.strip().lower()
    return _ALIASES.get(lowered, lowered)


def serving_dtype(model_dtype: str) -> str:
    """The dtype vLLM serves a checkpoint in when ``--dtype auto``: fp32 checkpoints run as bf16."""
    dtype = normalise_dtype(model_dtype)
    return "bf16" if dtype == "fp32" else dtype


def weight_bytes_per_param(dtype: str) -> float:
    """Bytes one parameter takes in ``dtype``."""
    key = normalise_dtype(dtype)
    if key not in WEIGHT_DTYPES:
        raise UsageError(f"unknown weight dtype {dtype!r}: use one of bf16, fp16, fp8, int8, int4")
    return WEIGHT_DTYPES[key]


def kv_bytes_per_element(kv_dtype: str, model_dtype: str) -> float:
    """Bytes one KV element takes; ``auto`` means the model's serving dtype."""
    key = normalise_dtype(kv_dtype)
    if key == "auto":
        key = serving_dtype(model_dtype)
    if key not in KV_DTYPES:
        raise UsageError(f"unknown KV cache dtype {kv_dtype!r}: use one of auto, bf16, fp16, fp8, int8, int4")
    return KV_DTYPES[key]
