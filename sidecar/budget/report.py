"""Presenting a ledger: the JSON document (exact bytes) and the human table (GiB only)."""

from __future__ import annotations

from typing import Any

from sidecar.budget.advice import Option
from sidecar.budget.ledger import Ledger, PlanRequest
from sidecar.budget.pipeline import PipelineStage
from sidecar.units import format_gib

_SUMMARY_FIELDS = (
    "kv_bytes_total",
    "weights_bytes",
    "total_bytes",
    "kv_pool_tokens",
    "max_concurrency",
    "verdict",
)


def _figures(ledger: Ledger) -> dict[str, Any]:
    return {
        "kv_bytes_per_token": ledger.kv_bytes_per_token,
        "kv_bytes_per_sequence": ledger.kv_bytes_per_sequence,
        "kv_bytes_total": ledger.kv_bytes_total,
        "weights_bytes": ledger.weights_bytes,
        "activation_bytes": ledger.activation_bytes,
        "overhead_bytes": ledger.overhead_bytes,
        "lora_bytes": ledger.lora_bytes,
        "total_bytes": ledger.total_bytes,
        "gpu_memory_bytes": ledger.gpu_memory_bytes,
        "headroom_bytes": ledger.headroom_bytes,
        "kv_pool_bytes": ledger.kv_pool_bytes,
        "kv_pool_tokens": ledger.kv_pool_tokens,
        "kv_pool_blocks": ledger.kv_pool_blocks,
        "kv_block_size": ledger.block_size,
        "max_concurrency": ledger.max_concurrency,
        "verdict": ledger.verdict.value,
        "vllm_profile": {
            **{f"{name}_bytes": value for name, value in ledger.profile.items()},
            "batch_tokens": ledger.profile_batch[0],
            "batch_sequences": ledger.profile_batch[1],
        },
    }


def _inputs(ledger: Ledger) -> dict[str, Any]:
    req = ledger.request
    arch = req.architecture
    return {
        "model": req.model,
        "gpu": req.gpu,
        "parameters": ledger.parameters,
        "parameter_source": arch.parameter_source,
        "weight_dtype": req.effective_weight_dtype,
        "kv_cache_dtype": req.kv_cache_dtype,
        "max_model_len": req.effective_max_model_len,
        "concurrency": req.concurrency,
        "gpu_memory_utilization": req.effective_gpu_memory_utilization,
        "vllm_version": str(req.release),
        "enforce_eager": req.enforce_eager,
        "async_scheduling": req.async_scheduling,
        "model_runner": req.effective_model_runner.value,  # vLLM's V1 or V2 GPU model runner
        "tensor_parallel_size": req.tensor_parallel_size,
        "pipeline_parallel_size": req.pipeline_parallel_size,
        "data_parallel_size": req.data_parallel_size,
        "enable_expert_parallel": req.enable_expert_parallel,
        "block_size": req.block_size,
        "enable_prefix_caching": req.enable_prefix_caching,
        "mamba_ssm_cache_dtype": req.mamba_ssm_cache_dtype,
        "mamba_cache_dtype": req.mamba_cache_dtype,
        "max_num_seqs": req.effective_batch[1],
        "max_num_batched_tokens": req.effective_batch[0],
        "lora": None
        if req.lora is None
        else {
            "max_loras": req.lora.max_loras,
            "max_lora_rank": req.lora.max_lora_rank,
            "fully_sharded_loras": req.lora.fully_sharded,
            "target_modules": sorted(req.lora.target_modules) if req.lora.target_modules else None,
        },
        "cpu_offload_bytes": req.cpu_offload_bytes,
        "speculative": None
        if req.speculative is None
        else {
            "method": req.speculative.method,
            "num_speculative_tokens": req.speculative.num_speculative_tokens,
            "model": req.speculative.model,  # the drafter's, when it has one
            "drafter_read": req.speculative.drafter is not None,  # its config.json was read
        },
        "layers": arch.num_layers,
        "kv_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        # Gemma 4: full-attention layers' own (head size, KV heads); KV-shared layers hold no KV (Gemma 3n/4)
        "full_attention_head_dim": arch.full_attention_geometry()[0],
        "full_attention_kv_heads": arch.full_attention_geometry()[1],
        "kv_shared_layers": arch.kv_shared_layers,
    }


def _option_to_dict(option: Option) -> dict[str, Any]:
    figures = _figures(option.ledger)
    summary = {k: figures[k] for k in _SUMMARY_FIELDS}
    return {"description": option.description, **option.changes, **summary, "caveat": option.caveat}


def ledger_to_dict(ledger: Ledger, options: list[Option]) -> dict[str, Any]:
    """The ``plan --format json`` document: the inputs, every figure in bytes, and the options."""
    return {
        **_figures(ledger),
        "inputs": _inputs(ledger),
        "notes": list(ledger.notes),
        "pipeline_stages": [_stage_to_dict(stage) for stage in ledger.stages],
        "options": [_option_to_dict(o) for o in options],
    }


def _stage_to_dict(stage: PipelineStage) -> dict[str, int]:
    return {
        "stage": stage.index + 1,
        "layers": stage.layers,
        "weights_bytes": stage.weights,
        "activation_bytes": stage.activation,
        "lora_bytes": stage.lora,
        "kv_pool_blocks": stage.pool_blocks,
    }


def _profile_line(ledger: Ledger) -> str:
    """``= requested - weights - activation - ...``: where vLLM's pool comes from."""
    terms = " - ".join(
        f"{name.replace('_', ' ')} {format_gib(value)}" for name, value in ledger.profile.items()
    )
    tokens, sequences = ledger.profile_batch
    return f"    = {terms}  (profile batch: {tokens:,} tokens over {sequences:,} sequences)"


def _lora_shape(request: PlanRequest) -> str:
    slots = request.lora
    assert slots is not None  # noqa: S101 - only called with LoRA on
    sharded = ", fully sharded" if slots.fully_sharded else ""
    return f"{slots.max_loras} x rank {slots.max_lora_rank}{sharded}"


def render_table(ledger: Ledger, options: list[Option]) -> str:
    """The human-readable plan: the ledger in GiB, vLLM's view, the verdict and the options."""
    req = ledger.request
    inputs = _inputs(ledger)
    lines = [
        f"{req.model} on {req.gpu} ({format_gib(ledger.gpu_memory_bytes)}), "
        f"{req.concurrency} x {inputs['max_model_len']:,} tokens, weights {inputs['weight_dtype']}, "
        f"KV {req.kv_cache_dtype}, tensor parallel {req.tensor_parallel_size}"
        + (f", pipeline parallel {req.pipeline_parallel_size}" if req.pipeline_parallel_size > 1 else "")
        + (f", data parallel {req.data_parallel_size} (per engine)" if req.data_parallel_size > 1 else "")
        + (", expert parallel" if req.enable_expert_parallel else ""),
        "",
        f"  {'weights':<28}{format_gib(ledger.weights_bytes):>14}   "
        f"({ledger.parameters / 1e9:.2f}B parameters)",
        f"  {'KV cache':<28}{format_gib(ledger.kv_bytes_total):>14}   "
        f"({ledger.kv_bytes_per_token:,} B/token, {format_gib(ledger.kv_bytes_per_sequence)}/sequence)",
        f"  {'activation':<28}{format_gib(ledger.activation_bytes):>14}",
        f"  {'framework overhead':<28}{format_gib(ledger.overhead_bytes):>14}",
        *(
            [f"  {'LoRA adapter slots':<28}{format_gib(ledger.lora_bytes):>14}   ({_lora_shape(req)})"]
            if req.lora
            else []
        ),
        f"  {'total':<28}{format_gib(ledger.total_bytes):>14}   "
        f"of {format_gib(ledger.gpu_memory_bytes)}, headroom {format_gib(ledger.headroom_bytes)}",
        "",
        f"  vLLM {req.release} at gpu_memory_utilization {req.effective_gpu_memory_utilization}: KV pool "
        f"{format_gib(ledger.kv_pool_bytes)} = {ledger.kv_pool_tokens:,} tokens, maximum concurrency "
        f"{ledger.max_concurrency:.2f}x for {inputs['max_model_len']:,} tokens per request",
        _profile_line(ledger),
        "",
        f"  verdict: {ledger.verdict.value}",
    ]
    lines.extend(f"  note: {note}" for note in ledger.notes)
    if options:
        lines += ["", "  alternatives that fit:"]
        for option in options:
            changed = ", ".join(f"{k}={v}" for k, v in option.changes.items())
            lines.append(
                f"    {option.description:<32}{changed:<40}total {format_gib(option.ledger.total_bytes)}, "
                f"KV {format_gib(option.ledger.kv_bytes_total)}, {option.ledger.max_concurrency:.2f}x"
            )
            if option.caveat:
                lines.append(f"      but: {option.caveat}")
    return "\n".join(lines)
