"""The memory ledger of one deployment, two ways: the seeds' arithmetic and vLLM's own view.

**The seeds' ledger** (what a person budgets on paper): ``weights + KV + activation + overhead``
against the GPU's memory, where KV is ``concurrency`` sequences of ``max_model_len`` tokens
each, and one token costs ``2 x layers x KV heads x head size x KV bytes`` (MLA: one latent of
``kv_lora_rank + qk_rope_head_dim`` per layer, no factor 2). Sliding-window layers hold at most
``window`` tokens of a sequence. Activation and framework overhead default to the seeds'
0.5 GiB and 1.5 GiB.

**vLLM's view** (what the engine will log at start-up): vLLM requests ``ceil(gpu_memory x
gpu_memory_utilization)``, subtracts the weights (less what ``--cpu-offload-gb`` keeps in CPU memory:
:func:`~sidecar.budget.profile.cpu_offloaded_bytes`), the activation peak of its profile run, non-torch
memory, (from 0.20, unless eager) its CUDA-graph estimate and, with ``--enable-lora``, the adapter slots it
allocated with the weights (:mod:`sidecar.budget.lora`; the seeds' total counts them too), and turns the
rest into a pool of whole blocks (``block_size`` tokens of every layer). The release (``vllm_version``)
selects the defaults and which terms apply: :mod:`sidecar.budget.vllm_release` says which releases each rule
holds for and where it was read. The pool in tokens and the "Maximum concurrency for N tokens per request"
figure follow from it; a sliding-window layer needs at most ``cdiv(min(window - 1 + max_num_batched_tokens,
max_model_len), block) + 1`` blocks per request, a chunked local-attention layer (Llama 4) ``cdiv(min(chunk
+ max_num_batched_tokens, max_model_len), block)``. ``--kv-cache-memory-bytes`` and
``--num-gpu-blocks-override`` replace the computed pool, as they do in vLLM (an overriding block holds one
KV cache group's layers, half the layers of a model with one full and one sliding group:
:mod:`sidecar.budget.kv_groups`).

Layers that cache other than ``2 x KV heads x head size`` have a module each: Gemma 4's full layers
(:mod:`sidecar.budget.gemma4`), MiMo-V2's sliding and full layers with values narrower than keys
(:mod:`sidecar.budget.mimo`), DeepSeek-V3.2's indexer cache beside MLA's latent
(:mod:`sidecar.budget.indexer`); pages of different sizes are unified as vLLM does
(:class:`sidecar.budget.kv_terms.KvPages`). DeepSeek-V4's five kinds of cache are packed into a pool of
their own (:mod:`sidecar.budget.deepseek_v4`).

**Tensor parallelism** divides weights and KV heads per GPU (never below one KV head; an MLA
latent and a DSA indexer's cache and weights are replicated). **Pipeline parallelism** gives each stage its
layers, and the pool is the smallest stage's (:mod:`sidecar.budget.pipeline`). **Data parallelism** runs that
many engines; each has its own pool, but a MoE model's experts are spread over all of their GPUs
(:mod:`sidecar.budget.experts`). Memory figures are per GPU; token counts are per engine.

**Weights and activation as vLLM profiles them** live in :mod:`sidecar.budget.profile`: vLLM's view
subtracts the weights as loaded (quantisation leaves embeddings and LM head 16-bit; MXFP4 experts are
padded to the kernel's tiles) and the profile's torch peak (the larger of the forward and sampler passes, per
model runner, plus MoE workspaces), while the seeds' ledger keeps the paper figures beside the seeds'
activation default when one is given.

**Verdict**: ``does-not-fit`` when the total exceeds GPU memory or vLLM could not fit one
full-length request (it refuses to start); ``tight`` when it fits on paper with under 10%
headroom ("纸面能过、实测悬") or vLLM's maximum concurrency is below the target; else ``fits``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from sidecar.budget.architecture import Architecture
from sidecar.budget.deepseek_v41 import v4_terms
from sidecar.budget.dtypes import KV_DTYPES, normalise_dtype, weight_bytes_per_param
from sidecar.budget.experts import ExpertPlacement, expert_placement
from sidecar.budget.kv_formats import VLLM_KV_FORMATS, kv_format_notes, packed_block_size
from sidecar.budget.kv_groups import kv_groups
from sidecar.budget.kv_terms import (
    full_request_blocks,
    kv_layer_kinds,
    kv_pages,
    layer_kv_bytes_per_token,
    reported_pool_tokens,
    sequence_kv_bytes,
    state_note,
    state_terms,
)
from sidecar.budget.lora import LoraSlots, lora_graph_copies, lora_slot_bytes
from sidecar.budget.model_runner import ModelRunner, batches_in_flight, default_model_runner
from sidecar.budget.notes import plan_notes
from sidecar.budget.parameters import body_parameter_count, parameter_count
from sidecar.budget.pipeline import PipelineStage, pipeline_stages
from sidecar.budget.profile import (
    cpu_offloaded_bytes,
    estimate_activation_bytes,
    hopper_or_blackwell,
    layer_weight_bytes,
    loaded_weights_per_gpu,
    paper_weights_per_gpu,
)
from sidecar.budget.refusals import check_as_vllm_does
from sidecar.budget.sampler_pass import resident_sampler_bytes
from sidecar.budget.speculative import SpeculativeSettings, drafter_extra_kv_bytes, drafter_weight_bytes
from sidecar.budget.verdict import Verdict, plan_verdict
from sidecar.budget.vllm_release import (
    DEFAULT_CUDA_GRAPH_BYTES,
    DEFAULT_RELEASE,
    VllmRelease,
    extensible_kept_free,
)
from sidecar.errors import UsageError
from sidecar.units import GIB

DEFAULT_OVERHEAD_BYTES: Final = 3 * GIB // 2
"""The seeds' framework overhead: CUDA context, graphs, fragmentation (框架开销 ~1.5 GiB)."""
DEFAULT_BLOCK_SIZE: Final = VllmRelease.parse(DEFAULT_RELEASE).default_block_size
"""vLLM's default KV block size on GPUs in the default release, in tokens (the release decides it)."""


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """Everything the ledger depends on; ``None`` means "vLLM's default" or "the model's own"."""

    architecture: Architecture
    gpu_memory_bytes: int
    model: str = "model"
    gpu: str = "custom"
    weight_dtype: str | None = None
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None
    concurrency: int = 1
    gpu_memory_utilization: float | None = None  # None: the release's default (0.9, or 0.92 from 0.20)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1  # stages, each its own GPU (or TP group): :mod:`sidecar.budget.pipeline`
    data_parallel_size: int = 1  # engines; figures are per GPU and per engine (:mod:`sidecar.budget.experts`)
    enable_expert_parallel: bool = False  # vLLM --enable-expert-parallel: whole experts per GPU
    block_size: int = 0  # --block-size; 0: the release's default (16; 64 from 0.34), resolved at construction
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    activation_bytes: int | None = None
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES
    non_torch_bytes: int | None = None  # None: the release's figure for this TP size
    kv_cache_memory_bytes: int | None = None  # vLLM --kv-cache-memory-bytes: the pool, not derived
    num_gpu_blocks_override: int | None = None  # vLLM --num-gpu-blocks-override: the pool in blocks
    allow_long_max_model_len: bool = False  # vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    flashinfer_sampler: bool | None = None  # vLLM's VLLM_USE_FLASHINFER_SAMPLER (None: unset)
    vllm_version: str = DEFAULT_RELEASE  # selects the release's defaults and profiling rules
    enforce_eager: bool = False  # vLLM --enforce-eager: no CUDA graphs to budget for
    async_scheduling: bool = True  # vLLM's default on GPUs; --no-async-scheduling (and the CPU platform) off
    model_runner: ModelRunner | None = None  # vLLM's VLLM_USE_V2_MODEL_RUNNER; None: the release's choice
    cuda_graph_bytes: int | None = None  # a measured CUDA-graph figure (vLLM's "Estimated CUDA graph memory")
    cpu_offload_bytes: int = 0  # vLLM --cpu-offload-gb: layer weights kept in CPU memory, per GPU
    speculative: SpeculativeSettings | None = (
        None  # vLLM --speculative-config (:mod:`sidecar.budget.speculative`)
    )
    lora: LoraSlots | None = None  # vLLM --enable-lora: adapter slots (:mod:`sidecar.budget.lora`)
    enable_prefix_caching: bool | None = (
        None  # None: the release's default (hybrid state models: state_layers)
    )
    mamba_ssm_cache_dtype: str = "auto"  # vLLM --mamba-ssm-cache-dtype (state layers' temporal state)
    mamba_cache_dtype: str = "auto"  # vLLM --mamba-cache-dtype (the conv state; the SSM state too when auto)

    def __post_init__(self) -> None:
        if self.block_size == 0:  # frozen: set once, here, so every reader sees the block vLLM uses
            object.__setattr__(self, "block_size", self.release.default_block_size)
        positive = {
            "--gpu-memory": self.gpu_memory_bytes,
            "--concurrency": self.concurrency,
            "--tensor-parallel-size": self.tensor_parallel_size,
            "--pipeline-parallel-size": self.pipeline_parallel_size,
            "--data-parallel-size": self.data_parallel_size,
            "--block-size": self.block_size,
            "--max-model-len": self.max_model_len or 1,
            "--max-num-seqs": self.max_num_seqs or 1,
            "--max-num-batched-tokens": self.max_num_batched_tokens or 1,
            "--kv-cache-memory": self.kv_cache_memory_bytes or 1,
            "--num-gpu-blocks-override": self.num_gpu_blocks_override or 1,
        }
        for flag, value in positive.items():
            if value <= 0:
                raise UsageError(f"{flag} must be greater than zero, got {value}")
        utilization = self.effective_gpu_memory_utilization
        if not 0.0 < utilization <= 1.0:
            raise UsageError(f"--gpu-memory-utilization must be in (0, 1], got {utilization}")
        kv = normalise_dtype(self.kv_cache_dtype)
        if kv != "auto" and kv not in KV_DTYPES and kv not in VLLM_KV_FORMATS:
            raise UsageError(
                f"unknown KV cache dtype {self.kv_cache_dtype!r}: use auto, bf16, fp16, fp8, int8, int4, "
                "or one of vLLM's formats (fp8_e4m3, int8_per_token_head, turboquant_k8v4, ...)"
            )
        weight_bytes_per_param(self.effective_weight_dtype)  # validates
        check_as_vllm_does(self)

    @property
    def release(self) -> VllmRelease:
        """The vLLM release whose rules apply."""
        return VllmRelease.parse(self.vllm_version)

    @property
    def experts(self) -> ExpertPlacement | None:
        """How one GPU holds the routed experts, ``None`` for a dense model."""
        moe = self.architecture.moe
        if moe is None:
            return None
        return expert_placement(
            moe.num_experts, self.tensor_parallel_size, self.data_parallel_size,
            expert_parallel=self.enable_expert_parallel,
        )  # fmt: skip

    @property
    def extensible_kv_cache(self) -> bool:
        """Whether vLLM sizes the pool after warm-up (0.34's default unless a flag gives the pool)."""
        given = self.kv_cache_memory_bytes is not None or self.num_gpu_blocks_override is not None
        return self.release.extensible_kv_cache(pool_given=given)

    @property
    def effective_gpu_memory_utilization(self) -> float:
        """``--gpu-memory-utilization``, else the release's default."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return self.release.default_gpu_memory_utilization(extensible=self.extensible_kv_cache)

    @property
    def effective_batch(self) -> tuple[int, int]:
        """``(max_num_batched_tokens, max_num_seqs)``: the flags, else ``vllm serve``'s defaults."""
        tokens, seqs = self.release.batch_defaults(
            self.gpu_memory_bytes, self.gpu, self.effective_max_model_len
        )
        return self.max_num_batched_tokens or tokens, self.max_num_seqs or seqs

    @property
    def in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet settled, which a sliding-window cap adds (vLLM's in-flight tokens)."""
        stages, overlap = self.pipeline_parallel_size, self.async_scheduling
        runner = self.effective_model_runner
        batches = batches_in_flight(self.release, runner, pipeline_stages=stages, async_scheduling=overlap)
        return self.effective_batch[0] * batches

    @property
    def effective_model_runner(self) -> ModelRunner:
        """The GPU model runner vLLM runs: the one named, else the release's (:mod:`...model_runner`)."""
        method = self.speculative.method if self.speculative is not None else None
        return self.model_runner or default_model_runner(self.release, self.architecture, method)

    @property
    def effective_cuda_graph_bytes(self) -> int:
        """CUDA-graph memory the release takes off the KV budget (0 before 0.20 or when eager)."""
        if not self.release.subtracts_cuda_graphs(enforce_eager=self.enforce_eager):
            return 0
        if self.cuda_graph_bytes is not None:
            return self.cuda_graph_bytes
        return DEFAULT_CUDA_GRAPH_BYTES * lora_graph_copies(self.lora, self.release)

    @property
    def effective_weight_dtype(self) -> str:
        """The weight dtype asked for, else the checkpoint's."""
        return normalise_dtype(self.weight_dtype) if self.weight_dtype else self.architecture.weight_dtype

    @property
    def effective_max_model_len(self) -> int:
        """``--max-model-len``, else the model's ``max_position_embeddings`` (vLLM's default)."""
        if self.max_model_len is not None:
            return self.max_model_len
        if self.architecture.max_position_embeddings is None:
            raise UsageError("the model's config.json has no max_position_embeddings: give --max-model-len")
        return self.architecture.max_position_embeddings


@dataclass(frozen=True, slots=True)
class Ledger:
    """The predicted budget of a deployment; byte figures are per GPU, token counts per engine."""

    request: PlanRequest
    parameters: int
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    kv_bytes_total: int
    weights_bytes: int
    activation_bytes: int
    overhead_bytes: int
    total_bytes: int
    gpu_memory_bytes: int
    kv_pool_bytes: int
    kv_pool_tokens: int
    kv_pool_blocks: int  # vLLM's num_gpu_blocks: blocks of one KV cache group's layers
    max_concurrency: float
    verdict: Verdict
    notes: tuple[str, ...] = field(default=())
    profile: dict[str, int] = field(default_factory=dict)  # the budget and vLLM's non-KV terms (bytes/GPU)
    profile_batch: tuple[int, int] = (0, 0)  # the profile run's (tokens, sequences)
    stages: tuple[PipelineStage, ...] = ()  # pipeline parallel: each stage; ``profile`` is the smallest's
    lora_bytes: int = 0  # LoRA adapter slots (vLLM --enable-lora), in the total and vLLM's profile
    block_size: int = DEFAULT_BLOCK_SIZE  # tokens a block holds: --block-size, or larger for state layers

    @property
    def headroom_bytes(self) -> int:
        """GPU memory left after the seeds' ledger (negative when it does not fit)."""
        return self.gpu_memory_bytes - self.total_bytes


def _vllm_profile(
    request: PlanRequest, loaded: int, activation: int, lora: int, offload: int
) -> dict[str, int]:
    """What vLLM requests and the non-KV terms it subtracts, by name (LoRA slots, an MTP drafter when on).

    ``loaded``: the weights as loaded; ``offload``: what ``--cpu-offload-gb`` keeps of them in CPU memory.
    """
    non_torch, arch = request.non_torch_bytes, request.architecture
    if non_torch is None:
        gpu = hopper_or_blackwell(request.gpu)
        non_torch = request.release.non_torch_bytes(request.tensor_parallel_size, hopper_or_blackwell=gpu)
    profile = {
        "requested": math.ceil(request.gpu_memory_bytes * request.effective_gpu_memory_utilization),
        "weights": loaded - offload,
        "activation": activation,
        "non_torch": non_torch,
        "cuda_graphs": request.effective_cuda_graph_bytes,
    }
    transient = activation - resident_sampler_bytes(request)  # 0.34's margin follows the transient peak
    kept = extensible_kept_free(profile["requested"], request.gpu_memory_bytes, transient)
    if request.extensible_kv_cache and kept:  # 0.34: a margin kept free; binds near utilisation 1.0
        profile["kept_free"] = kept
    if request.lora:
        profile["lora"] = lora
    if drafter := drafter_weight_bytes(request, loaded, body_parameter_count(arch)):
        profile["drafter"] = drafter
    return profile


def build_ledger(request: PlanRequest) -> Ledger:
    """Compute the ledger, vLLM's pool and the verdict for ``request``."""
    arch = request.architecture
    per_layer = layer_kv_bytes_per_token(request)
    kinds, extra = kv_layer_kinds(request), drafter_extra_kv_bytes(request, per_layer)
    state = state_terms(request, per_layer)
    block = state.block_size if state else packed_block_size(request, request.block_size)
    pages = kv_pages(request, kinds, per_layer, block)
    v4 = v4_terms(request)  # DeepSeek-V4, V4.1: their own packed pools (sidecar.budget.deepseek_v41)
    per_token, per_sequence = (
        (v4.per_token, v4.per_sequence)
        if v4
        else (pages.per_token(kinds) + extra, sequence_kv_bytes(request, kinds, pages, extra, state))
    )
    params = parameter_count(arch)
    loaded = loaded_weights_per_gpu(request, params)
    offload = cpu_offloaded_bytes(request, layer_weight_bytes(request, loaded))
    weights = paper_weights_per_gpu(request, params) - offload
    activation = estimate_activation_bytes(request)
    kv_total = request.concurrency * per_sequence
    lora = lora_slot_bytes(request, request.lora) if request.lora else 0
    tokens, seqs = request.effective_batch
    profile = _vllm_profile(request, loaded, activation, lora, offload)
    total = weights + round(kv_total) + activation + request.overhead_bytes + lora + profile.get("drafter", 0)
    requested = profile.pop("requested")
    block_bytes = block * per_token
    # vLLM's blocks hold one KV cache group's layers, padding included; a request takes blocks in every group
    groups = v4.groups if v4 else kv_groups(kinds)
    group_block_bytes = v4.stride if v4 else pages.page_bytes * groups.layers_per_group + block * extra
    pool_override = request.kv_cache_memory_bytes
    if request.num_gpu_blocks_override is not None:
        pool_override = round(request.num_gpu_blocks_override * group_block_bytes)
    pool = max(0, requested - sum(profile.values())) if pool_override is None else pool_override
    num_blocks = int(pool // block_bytes) if block_bytes else 0
    request_blocks = v4.request_blocks if v4 else full_request_blocks(request, groups, state, pages)
    pool_blocks = int(pool // group_block_bytes) if per_layer else 0  # vLLM's num_gpu_blocks
    stages: tuple[PipelineStage, ...] = ()
    if request.pipeline_parallel_size > 1 and per_layer and pool_override is None and not (state or v4):
        stages = pipeline_stages(
            request, profile, requested, group_block_bytes, groups.layers_per_group, loaded=loaded
        )
        limiting = min(stages, key=lambda stage: stage.pool_blocks)  # the engine takes the smallest
        weights = round(weights * limiting.weights / max(1, profile["weights"]))
        profile.update(weights=limiting.weights, activation=limiting.activation)
        if "drafter" in profile and limiting.index != len(stages) - 1:
            del profile["drafter"]
        if request.lora:
            profile["lora"] = lora = limiting.lora
        pool, pool_blocks = max(0, requested - sum(profile.values())), limiting.pool_blocks
        share = limiting.kv_layers / max(1, sum(k.attends for k in kinds))
        num_blocks, activation = pool_blocks, limiting.activation
        per_token, per_sequence = per_token * share, per_sequence * share
        kv_total = request.concurrency * per_sequence
        total = (
            weights + round(kv_total) + activation + request.overhead_bytes + lora + profile.get("drafter", 0)
        )
    exact_concurrency = pool_blocks / request_blocks if request_blocks else 0.0
    max_concurrency = round(exact_concurrency, 2)
    pool_tokens = reported_pool_tokens(
        request, groups, state, (exact_concurrency, pool_blocks, num_blocks), block
    )

    return Ledger(
        request=request,
        parameters=params,
        kv_bytes_per_token=round(per_token),
        kv_bytes_per_sequence=round(per_sequence),
        kv_bytes_total=round(kv_total),
        weights_bytes=weights,
        activation_bytes=activation,
        overhead_bytes=request.overhead_bytes,
        lora_bytes=lora,
        total_bytes=total,
        gpu_memory_bytes=request.gpu_memory_bytes,
        kv_pool_bytes=pool,
        kv_pool_tokens=pool_tokens,
        kv_pool_blocks=pool_blocks,
        max_concurrency=max_concurrency,
        verdict=plan_verdict(request.gpu_memory_bytes, total, max_concurrency, request.concurrency),
        notes=plan_notes(request, max_concurrency, (weights, profile["weights"]), stages)
        + state_note(request, state, groups.state)
        + kv_format_notes(request, block),
        profile={"requested": requested, **profile},
        profile_batch=(tokens, min(seqs, tokens)),
        stages=stages,
        block_size=v4.block if v4 else block,  # DeepSeek-V4, V4.1: their latents' block (the scheduler's)
    )
