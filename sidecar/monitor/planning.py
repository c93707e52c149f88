"""Which settings the live prediction uses: the operator's flags, else what the engine reports.

vLLM tells some of its settings on ``/metrics`` (``cache_config_info``: block size, KV dtype,
``gpu_memory_utilization``, a blocks override, a fixed KV memory size) and ``/v1/models``
(``max_model_len``) and ``/version`` (the release, whose defaults and profiling rules apply); NVML
tells the GPU's memory. :func:`resolve_plan_request` merges them
with the flags, a flag given explicitly always winning, and returns ``None`` when a
prediction is impossible (no ``--model``, or no GPU size from ``--gpu``, ``--gpu-memory``
or NVML).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.budget.architecture import Architecture
from sidecar.budget.dtypes import KV_DTYPES, normalise_dtype
from sidecar.budget.kv_formats import KV_FORMATS
from sidecar.budget.ledger import PlanRequest
from sidecar.budget.lora import LoraSlots
from sidecar.budget.model_runner import ModelRunner
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.budget.vllm_release import VllmRelease
from sidecar.errors import UsageError
from sidecar.settings import default_of
from sidecar.signals.vllm import CacheConfig

MODEL_RETRY_SECONDS = 30.0
"""How often ``run`` tries again a ``--model`` it could not resolve (vLLM fills the HF cache as it loads)."""


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """The deployment flags as given (``None`` = not given on the command line or environment)."""

    architecture: Architecture | None = None
    model: str = "model"
    gpu: str = "custom"
    gpu_memory_bytes: int | None = None
    weight_dtype: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    concurrency: int = default_of(PlanRequest, "concurrency")  # the budget's own defaults, not copies
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = default_of(PlanRequest, "tensor_parallel_size")
    pipeline_parallel_size: int = default_of(PlanRequest, "pipeline_parallel_size")
    data_parallel_size: int | None = None  # None: the engines vLLM's page labels (``engine``), else 1
    enable_expert_parallel: bool = False
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    activation_bytes: int | None = None
    overhead_bytes: int | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    allow_long_max_model_len: bool = False  # VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, as vLLM reads it
    flashinfer_sampler: bool | None = None  # VLLM_USE_FLASHINFER_SAMPLER, as vLLM reads it (None: unset)
    model_runner: ModelRunner | None = None  # VLLM_USE_V2_MODEL_RUNNER, as vLLM reads it (None: unset)
    vllm_version: str | None = None  # None: the engine's /version, else the default release (0.32.0)
    enforce_eager: bool = False
    async_scheduling: bool = default_of(PlanRequest, "async_scheduling")
    enable_prefix_caching: bool | None = None  # None: the engine's page, else the release's default
    mamba_ssm_cache_dtype: str = default_of(PlanRequest, "mamba_ssm_cache_dtype")
    mamba_cache_dtype: str = default_of(PlanRequest, "mamba_cache_dtype")
    cuda_graph_bytes: int | None = None
    lora: LoraSlots | None = None  # --enable-lora; else the slots the page names, at vLLM's default rank
    cpu_offload_bytes: int = 0  # vLLM --cpu-offload-gb (its page does not say it)
    speculative: SpeculativeSettings | None = (
        None  # vLLM --speculative-config (the page gives k, not the method)
    )


def _parseable(version: str | None) -> str | None:
    try:
        return str(VllmRelease.parse(version)) if version else None
    except UsageError:
        return None


def _engine_kv_dtype(config: CacheConfig | None) -> str | None:
    if config is None or config.cache_dtype is None:
        return None
    dtype = normalise_dtype(config.cache_dtype)
    return dtype if dtype == "auto" or dtype in KV_DTYPES or dtype in KV_FORMATS else None


def _mamba_dtype(given: str, reported: str | None) -> str:
    """The flag when given, else the engine's (it reports what its model's hooks and platform settled)."""
    if given != "auto" or reported not in {"float32", "bfloat16", "float16"}:
        return given
    return str(reported)


def resolve_plan_request(
    inputs: PlanInputs,
    engine: CacheConfig | None,
    engine_max_model_len: int | None,
    gpu_total_bytes: int | None,
    *,
    engine_version: str | None = None,
    gpu_name: str = "nvml",
    engine_count: int | None = None,
    engine_max_loras: int | None = None,
) -> PlanRequest | None:
    """The request to predict with, or ``None`` when there is not enough to predict."""
    if inputs.architecture is None:
        return None
    gpu_memory = inputs.gpu_memory_bytes or gpu_total_bytes
    if gpu_memory is None:
        return None
    extra: dict[str, Any] = {} if inputs.overhead_bytes is None else {"overhead_bytes": inputs.overhead_bytes}
    version = inputs.vllm_version or _parseable(engine_version)
    if version is not None:
        extra["vllm_version"] = version
    return PlanRequest(
        architecture=inputs.architecture,
        gpu_memory_bytes=gpu_memory,
        model=inputs.model,
        gpu=inputs.gpu
        if inputs.gpu_memory_bytes
        else gpu_name,  # NVML's device name: vLLM's batch rules read it
        weight_dtype=inputs.weight_dtype,
        kv_cache_dtype=inputs.kv_cache_dtype or _engine_kv_dtype(engine) or "auto",
        max_model_len=inputs.max_model_len or engine_max_model_len,
        concurrency=inputs.concurrency,
        gpu_memory_utilization=inputs.gpu_memory_utilization
        or (engine.gpu_memory_utilization if engine else None),
        tensor_parallel_size=inputs.tensor_parallel_size,
        pipeline_parallel_size=inputs.pipeline_parallel_size,
        data_parallel_size=inputs.data_parallel_size or engine_count or 1,
        enable_expert_parallel=inputs.enable_expert_parallel,
        block_size=inputs.block_size or (engine.block_size if engine else None) or 0,  # 0: the release's
        max_num_seqs=inputs.max_num_seqs,
        max_num_batched_tokens=inputs.max_num_batched_tokens,
        activation_bytes=inputs.activation_bytes,
        kv_cache_memory_bytes=inputs.kv_cache_memory_bytes
        or (engine.kv_cache_memory_bytes if engine else None),
        num_gpu_blocks_override=inputs.num_gpu_blocks_override
        or (engine.num_gpu_blocks_override if engine else None),
        allow_long_max_model_len=inputs.allow_long_max_model_len,
        flashinfer_sampler=inputs.flashinfer_sampler,
        model_runner=inputs.model_runner,
        enforce_eager=inputs.enforce_eager,
        async_scheduling=inputs.async_scheduling,
        enable_prefix_caching=inputs.enable_prefix_caching
        if inputs.enable_prefix_caching is not None
        else (engine.enable_prefix_caching if engine else None),
        mamba_ssm_cache_dtype=_mamba_dtype(
            inputs.mamba_ssm_cache_dtype, engine.mamba_ssm_cache_dtype if engine else None
        ),
        mamba_cache_dtype=_mamba_dtype(
            inputs.mamba_cache_dtype, engine.mamba_cache_dtype if engine else None
        ),
        cuda_graph_bytes=inputs.cuda_graph_bytes,
        lora=inputs.lora or (LoraSlots(max_loras=engine_max_loras) if engine_max_loras else None),
        cpu_offload_bytes=inputs.cpu_offload_bytes,
        speculative=inputs.speculative,
        **extra,
    )
