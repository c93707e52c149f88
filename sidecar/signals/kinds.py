"""The model servers whose ``/metrics`` pages the sidecar reads."""

from __future__ import annotations

from enum import StrEnum


class EngineKind(StrEnum):
    """An engine, named as the inference gateway's endpoint picker names its built-in engine configs."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM_SERVE = "trtllm-serve"
    TRITON_TENSORRT_LLM = "triton-tensorrt-llm"
