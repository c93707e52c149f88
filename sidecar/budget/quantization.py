"""The weights' format of a quantised checkpoint, read from its ``config.json``'s ``quantization_config``.

AWQ and GPTQ (and their Marlin variants) are ``int4`` unless ``bits`` is 8; ``fp8``, ``fbgemm_fp8`` and
``modelopt`` are ``fp8``, but ModelOpt's ``NVFP4`` and ``W4A16_NVFP4`` algorithms (``quant_algo``, flat or
under ``quantization`` as vLLM 0.32.0's ``ModelOptQuantConfigBase`` reads it) are ``nvfp4``, as are
compressed-tensors' 4-bit float weights; bitsandbytes is ``int4`` or ``int8`` by ``load_in_4bit``; ``mxfp4``
(gpt-oss) quantises the MoE experts only; compressed-tensors checkpoints say it in their first config group's
weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final


def checkpoint_quantization(cfg: Mapping[str, Any]) -> str | None:  # noqa: PLR0911 - one return per method
    """The format ``quantization_config`` names: int4, int8, fp8, mxfp4 or nvfp4; ``None`` for none of them.

    A config without one at the top level is read from its ``text_config``, as vLLM 0.32.0 does for
    multimodal models (``get_quantization_config``, ``transformers_utils/model_arch_config_convertor.py``;
    Kimi K3 publishes its quantisation there).
    """
    quant = _quantization_config(cfg)
    if quant is None:
        return None
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits", quant.get("w_bit"))
    if method in {"awq", "gptq", "marlin", "awq_marlin", "gptq_marlin"}:
        return "int8" if bits == 8 else "int4"
    if method == "modelopt" and _modelopt_algo(quant) in {"NVFP4", "W4A16_NVFP4"}:
        return "nvfp4"
    if method in {"fp8", "fbgemm_fp8", "modelopt"}:
        return "fp8"
    if method == "bitsandbytes":
        return "int4" if quant.get("load_in_4bit") else "int8"
    if method == "mxfp4":  # gpt-oss: MoE experts in MXFP4, the rest in bf16 (modules_to_not_convert)
        return "mxfp4"
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    return None


def _compressed_tensors(quant: Mapping[str, Any]) -> str | None:
    """The weights' format of a compressed-tensors checkpoint (its first config group's weights)."""
    groups = quant.get("config_groups")
    first: Any = next(iter(groups.values()), None) if isinstance(groups, Mapping) else None
    weights = first.get("weights") if isinstance(first, Mapping) else None
    if not isinstance(weights, Mapping):
        return None
    bits, kind = weights.get("num_bits"), str(weights.get("type", "int"))
    if bits == 8:
        return "fp8" if kind == "float" else "int8"
    if bits == 4:
        return "nvfp4" if kind == "float" else "int4"
    return None


def _modelopt_algo(quant: Mapping[str, Any]) -> str:
    """ModelOpt's ``quant_algo``, flat or under ``quantization`` (hf_quant_config.json's), upper-cased."""
    nested = quant.get("quantization")
    source = nested if isinstance(nested, Mapping) else quant
    return str(source.get("quant_algo", "")).upper()


def _quantization_config(cfg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``quantization_config`` where vLLM reads it: the top level, else ``text_config``'s."""
    text = cfg.get("text_config")
    quant = cfg.get("quantization_config")
    if not isinstance(quant, Mapping) and isinstance(text, Mapping):
        quant = text.get("quantization_config")
    return quant if isinstance(quant, Mapping) else None


def expert_dtype(cfg: Mapping[str, Any], default: str | None = None) -> str | None:
    """The experts' format as DeepSeek-V4.1 reads it (``None``: the config names none and no ``default``).

    The config's ``expert_dtype``, else its ``quantization_config``'s (``DeepseekV41Config`` copies it up).
    """
    if "expert_dtype" in cfg:
        return str(cfg["expert_dtype"])
    quant = _quantization_config(cfg)
    return str(quant["expert_dtype"]) if quant is not None and "expert_dtype" in quant else default


def quantization_method(cfg: Mapping[str, Any]) -> str | None:
    """The checkpoint's ``quant_method`` as published (lower case), else ``None``."""
    quant = _quantization_config(cfg)
    return str(quant.get("quant_method", "")).lower() or None if quant is not None else None


PACKING_METHODS: Final = frozenset({"awq", "gptq", "marlin", "awq_marlin", "gptq_marlin", "mxfp4"})
"""Methods whose tensors hold several weights an element: AWQ and GPTQ pack 32 / ``bits`` into an int32
(``qweight``), gpt-oss's MXFP4 two into a byte (``*_blocks``)."""


def packs_weights(cfg: Mapping[str, Any]) -> bool:
    """Whether the checkpoint stores several weights in one tensor element (its headers then undercount).

    4-bit formats, and DeepSeek-V4's and V4.1's ``expert_dtype`` ``fp4`` experts (two values a byte): their
    safetensors headers' element counts are not parameters, so the config's arithmetic stands.
    """
    quant = _quantization_config(cfg)
    if quant is None:
        return False
    method = quantization_method(cfg)
    experts = expert_dtype(cfg, _DEFAULT_EXPERT_DTYPE.get(str(cfg.get("model_type"))))
    packed = checkpoint_quantization(cfg) in {"int4", "nvfp4"}
    return method in PACKING_METHODS or packed or experts == "fp4"


_DEFAULT_EXPERT_DTYPE: Final = {"deepseek_v4": "fp4"}
"""``DeepseekV4FP8Config.expert_dtype`` when a config is silent (``models/deepseek_v4/quant_config.py``)."""
