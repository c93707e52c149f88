"""Alternatives that make a deployment fit: the seeds' "three directions", computed.

Starting from a request that is ``tight`` or ``does-not-fit``, :func:`advise` tries, each on its own and in
the seeds' combinations: an FP8 KV cache, INT8 or INT4 weights, both, fewer concurrent full-length sequences
(the most that fit), a shorter context (the longest multiple of 1024 tokens that fits), with LoRA fewer
adapter slots or a lower rank (the most that fit), with speculative decoding the same deployment without it
(its drafter and the profile's rejection pass give their memory back) and, when one card cannot hold the
weights, more GPUs
(tensor parallel 2, 4 or 8, where vLLM accepts the size). It returns only the alternatives whose verdict is
``fits``, each with the settings it changes, its own totals and a caveat where one applies (FP8 KV on a GPU
without FP8 hardware, or on a GPU the catalog does not know).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final

from sidecar.budget.catalog import find_gpu
from sidecar.budget.dtypes import kv_bytes_per_element, weight_bytes_per_param
from sidecar.budget.kv_formats import kv_format
from sidecar.budget.ledger import Ledger, PlanRequest, build_ledger
from sidecar.budget.lora import LORA_RANKS
from sidecar.budget.verdict import Verdict

_CONTEXT_STEP: Final = 1024


@dataclass(frozen=True, slots=True)
class Option:
    """One alternative: what it changes (flag name to value) and the ledger it leads to."""

    description: str
    changes: dict[str, str | int]
    ledger: Ledger
    caveat: str | None = None


def _fp8_caveat(gpu_id: str) -> str | None:
    gpu = find_gpu(gpu_id)
    if gpu is None:
        return "needs a GPU with FP8 support (Ada, Hopper or newer)"
    if not gpu.fp8:
        return (
            f"{gpu.name} has no FP8 hardware (Ampere): whether vLLM's FP8 KV cache runs on it depends on the "
            "attention backend; check before relying on it"
        )
    return None


def _more_gpus(request: PlanRequest, ledger: Ledger) -> list[Option]:
    """Tensor-parallel sizes vLLM accepts, when the weights vLLM loads alone overfill one card."""
    if ledger.profile["weights"] < request.gpu_memory_bytes * request.effective_gpu_memory_utilization:
        return []
    for size in (2, 4, 8):
        if size <= request.tensor_parallel_size or request.architecture.num_attention_heads % size:
            continue
        candidate = build_ledger(replace(request, tensor_parallel_size=size))
        if candidate.verdict is Verdict.FITS:
            return [Option(f"{size} GPUs (tensor parallel)", {"tensor_parallel_size": size}, candidate)]
    return []


def _largest_fitting(values: Sequence[int], make: Callable[[int], PlanRequest]) -> PlanRequest | None:
    """``make(v)`` for the largest ``v`` in ``values`` whose plan fits, or ``None``."""
    best: PlanRequest | None = None
    low, high = 0, len(values) - 1
    while low <= high:  # verdicts are monotonic in concurrency and context length
        mid = (low + high) // 2
        candidate = make(values[mid])
        if build_ledger(candidate).verdict is Verdict.FITS:
            best, low = candidate, mid + 1
        else:
            high = mid - 1
    return best


def advise(request: PlanRequest) -> list[Option]:
    """Alternatives to ``request`` that fit, best-known remedies first; empty when it already fits."""
    current = build_ledger(request)
    if current.verdict is Verdict.FITS:
        return []
    model_dtype = request.architecture.dtype
    packed = kv_format(request.kv_cache_dtype) is not None  # vLLM's packed formats are 1 byte or less
    kv_is_wide = not packed and kv_bytes_per_element(request.kv_cache_dtype, model_dtype) > 1
    weight_bytes = weight_bytes_per_param(request.effective_weight_dtype)
    candidates: list[tuple[str, dict[str, str | int]]] = []
    if kv_is_wide:
        candidates.append(("FP8 KV cache", {"kv_cache_dtype": "fp8"}))
    for dtype in ("int8", "int4"):
        if weight_bytes > weight_bytes_per_param(dtype):
            candidates.append((f"{dtype.upper()} weights", {"weight_dtype": dtype}))
            if kv_is_wide:
                candidates.append(
                    (
                        f"{dtype.upper()} weights and FP8 KV cache",
                        {"weight_dtype": dtype, "kv_cache_dtype": "fp8"},
                    )
                )
    options: list[Option] = []
    for description, changes in candidates:
        ledger = build_ledger(replace(request, **changes))  # type: ignore[arg-type]
        if ledger.verdict is Verdict.FITS:
            caveat = _fp8_caveat(request.gpu) if "kv_cache_dtype" in changes else None
            options.append(Option(description, changes, ledger, caveat))
    if request.concurrency > 1:
        fewer = _largest_fitting(range(1, request.concurrency), lambda n: replace(request, concurrency=n))
        if fewer is not None:
            options.append(
                Option("fewer concurrent sequences", {"concurrency": fewer.concurrency}, build_ledger(fewer))
            )
    length = request.effective_max_model_len
    if length > _CONTEXT_STEP:
        shorter = _largest_fitting(
            range(_CONTEXT_STEP, length, _CONTEXT_STEP), lambda n: replace(request, max_model_len=n)
        )
        if shorter is not None and shorter.max_model_len is not None:
            options.append(
                Option("shorter context", {"max_model_len": shorter.max_model_len}, build_ledger(shorter))
            )
    return options + _smaller_lora(request) + _without_drafting(request) + _more_gpus(request, current)


def _smaller_lora(request: PlanRequest) -> list[Option]:
    """With ``--enable-lora``: the most adapter slots that fit, and the highest rank that does."""
    slots = request.lora
    if slots is None:
        return []
    options: list[Option] = []
    fewer = _largest_fitting(
        range(1, slots.max_loras), lambda n: replace(request, lora=replace(slots, max_loras=n))
    )
    if fewer is not None and fewer.lora is not None:
        changes: dict[str, str | int] = {"max_loras": fewer.lora.max_loras}
        options.append(Option("fewer LoRA adapter slots", changes, build_ledger(fewer)))
    ranks = [rank for rank in LORA_RANKS if rank < slots.max_lora_rank]
    lower = _largest_fitting(ranks, lambda r: replace(request, lora=replace(slots, max_lora_rank=r)))
    if lower is not None and lower.lora is not None:
        changes = {"max_lora_rank": lower.lora.max_lora_rank}
        options.append(Option("lower LoRA rank", changes, build_ledger(lower)))
    return options


def _without_drafting(request: PlanRequest) -> list[Option]:
    """With ``--speculative-config``: the same deployment without it (no drafter, no rejection pass)."""
    if request.speculative is None:
        return []
    plain = build_ledger(replace(request, speculative=None))
    if plain.verdict is not Verdict.FITS:
        return []
    changes: dict[str, str | int] = {"speculative_config": "none"}
    return [Option("no speculative decoding", changes, plain, "decoding is slower without the drafter")]
