"""The flags that describe a deployment (model, GPU, vLLM's settings), shared by ``plan``, ``run``, ``check``.

Split from :mod:`sidecar.flags` (the engine, admission and scrape flags); :mod:`sidecar.cli` builds the parser
from both and turns parsed flags into :class:`~sidecar.budget.ledger.PlanRequest` and
:class:`~sidecar.monitor.planning.PlanInputs`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Final

from sidecar.budget.dtypes import KV_DTYPES, normalise_dtype
from sidecar.budget.kv_formats import KV_FORMATS, VLLM_KV_FORMATS
from sidecar.budget.ledger import DEFAULT_OVERHEAD_BYTES, PlanRequest
from sidecar.budget.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, LORA_RANKS, LoraSlots
from sidecar.budget.model_runner import ModelRunner
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.budget.vllm_release import DEFAULT_RELEASE, NEWEST_MODELLED, VllmRelease
from sidecar.errors import UsageError
from sidecar.flags import choice
from sidecar.settings import default_of
from sidecar.units import GIB, parse_memory, parse_positive_int, parse_ratio

VLLM_VARIABLES: Final = (
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
    "VLLM_USE_FLASHINFER_SAMPLER",
    "VLLM_USE_V2_MODEL_RUNNER",
)
"""vLLM's own environment variables the plan reads, as vLLM reads them. The pod runs both containers, so the
chart passes the sidecar whichever of these vLLM's ``env`` sets (``templates/deployment.yaml``)."""


def _vllm_bool(environ: Mapping[str, str], name: str) -> bool | None:
    """``envs.py``'s ``maybe_convert_bool``: unset is ``None``, else ``bool(int(value))``; one-line error."""
    value = environ.get(name)
    try:
        return None if value is None else bool(int(value))
    except ValueError:
        raise UsageError(
            f"{name}={value!r} is not a number, and vLLM would refuse it too; use 0 or 1"
        ) from None


def vllm_variables(environ: Mapping[str, str]) -> dict[str, Any]:
    """:data:`VLLM_VARIABLES` as ``PlanRequest`` fields, read as vLLM's ``envs.py`` reads them."""
    long_name, sampler_name, runner_name = VLLM_VARIABLES
    v2_runner = _vllm_bool(environ, runner_name)
    return {
        "allow_long_max_model_len": environ.get(long_name, "0").strip().lower() in {"1", "true"},
        "flashinfer_sampler": _vllm_bool(environ, sampler_name),
        "model_runner": None if v2_runner is None else (ModelRunner.V2 if v2_runner else ModelRunner.V1),
    }


def vllm_version(text: str) -> str:
    """``--vllm-version``: normalised to ``major.minor.patch``."""
    return str(VllmRelease.parse(text))


def kv_dtype(text: str) -> str:
    """``--kv-cache-dtype``: ours or vLLM's spelling (``fp8_e4m3``, ``turboquant_k8v4``: ``kv_formats``)."""
    value = normalise_dtype(text)
    if value not in {"auto", *KV_DTYPES, *VLLM_KV_FORMATS}:
        raise UsageError(
            f"invalid KV cache dtype {text!r}: use auto, {', '.join(KV_DTYPES)}, fp8_e4m3/fp8_e5m2 or one "
            f"of vLLM's formats: {', '.join(KV_FORMATS)}"
        )
    return value


def add_deployment_flags(parser: argparse.ArgumentParser, *, engine_fills_in: bool = False) -> None:
    """Flags that describe the deployment: shared by ``plan``, ``run`` and ``check``.

    With ``engine_fills_in`` (``run``, ``check``) the settings vLLM reports on its ``/metrics``
    default to ``None``, so the engine's own value is used unless the flag is given.
    """

    def default(value: object) -> object:
        return None if engine_fills_in else value

    group = parser.add_argument_group("model and vLLM settings")
    add = group.add_argument
    add(
        "--model",
        help="Hugging Face id (read from the HF cache, else downloaded), model directory, config.json "
        "or catalog id (qwen2.5-7b)",
    )
    add("--revision", help="the model's Hub revision, as vLLM's --revision: branch, tag or commit")
    add(
        "--gpu",
        help="catalog GPU id: rtx3090, rtx4090, l4, a10, l40s, rtx-a6000, a100-40gb, a100-80gb, h100, h200",
    )
    add(
        "--gpu-memory",
        type=parse_memory,
        help="GPU memory instead of --gpu: 24GiB (24G, 24Gi: the same, binary) or 80GB (10^9 bytes each)",
    )
    add(
        "--weight-dtype",
        type=choice("bf16", "fp16", "fp8", "int8", "int4", "nvfp4"),
        help="default: the checkpoint's",
    )
    add(
        "--kv-cache-dtype",
        type=kv_dtype,
        default=default("auto"),
        help="KV cache dtype: auto (the model's), bf16, fp16, fp8, int8, int4, or vLLM's spellings "
        "(bfloat16, fp8_e4m3, fp8_e5m2, nvfp4, int8_per_token_head, turboquant_k8v4, ...)",
    )
    add(
        "--max-model-len",
        type=parse_positive_int,
        help="tokens per sequence (default: the model's or engine's)",
    )
    add(
        "--concurrency",
        type=parse_positive_int,
        default=default_of(PlanRequest, "concurrency"),
        help="sequences that must fit at full length (default %(default)s)",
    )
    add(
        "--gpu-memory-utilization",
        type=parse_ratio,
        help="vLLM's share of GPU memory (default: the release's, 0.92 from vLLM 0.20, else 0.9)",
    )
    add(
        "--tensor-parallel-size",
        type=parse_positive_int,
        default=default_of(PlanRequest, "tensor_parallel_size"),
        help="GPUs per engine (default %(default)s)",
    )
    add(
        "--pipeline-parallel-size",
        type=parse_positive_int,
        default=default_of(PlanRequest, "pipeline_parallel_size"),
        help="pipeline stages, each of --tensor-parallel-size GPUs (default %(default)s)",
    )
    add(
        "--data-parallel-size",
        type=parse_positive_int,
        default=default(default_of(PlanRequest, "data_parallel_size")),
        help="vLLM engines of tensor x pipeline GPUs each, sharing a MoE's experts (default 1; run: as many "
        "as the page reports)",
    )
    expert_help = "vLLM --enable-expert-parallel: each GPU holds whole experts, not a slice of each"
    add("--enable-expert-parallel", action="store_true", help=expert_help)
    block_help = "tokens per KV block (default: vLLM's, 16; 64 from 0.34; run: the engine's)"
    add("--block-size", type=parse_positive_int, default=None, help=block_help)
    add(
        "--vllm-version",
        type=vllm_version,
        default=None if engine_fills_in else DEFAULT_RELEASE,
        help=f"the vLLM release whose defaults and profiling rules apply, read up to {NEWEST_MODELLED} "
        f"(default {DEFAULT_RELEASE}" + (", or what the engine's /version says)" if engine_fills_in else ")"),
    )
    add("--enforce-eager", action="store_true", help="vLLM --enforce-eager: no CUDA graphs to budget")
    add(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=default_of(PlanRequest, "async_scheduling"),  # not on the engine's page: never engine-filled
        help="vLLM --[no-]async-scheduling: from 0.26 a sliding-window cap counts two batches in flight "
        "with it (on by default on GPUs; vLLM's CPU platform turns it off)",
    )
    add(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM --[no-]enable-prefix-caching: a hybrid model's state layers hold more blocks per request "
        "with it (default: the release's, or the engine's page)",
    )
    add(
        "--mamba-ssm-cache-dtype",
        default=default_of(PlanRequest, "mamba_ssm_cache_dtype"),
        choices=("auto", "float32", "bfloat16", "float16"),
        help="vLLM --mamba-ssm-cache-dtype: the state layers' SSM state (default %(default)s: the model's)",
    )
    add(
        "--mamba-cache-dtype",
        default=default_of(PlanRequest, "mamba_cache_dtype"),
        choices=("auto", "float32", "bfloat16", "float16"),
        help="vLLM --mamba-cache-dtype: the state layers' conv state, and their SSM state unless "
        "--mamba-ssm-cache-dtype or the model says otherwise (default %(default)s: the model's dtype)",
    )
    add("--cuda-graph-memory", type=parse_memory, help="a measured CUDA-graph figure (default 0.5GiB)")
    add("--max-num-seqs", type=parse_positive_int, help="vLLM --max-num-seqs")
    add("--max-num-batched-tokens", type=parse_positive_int, help="vLLM --max-num-batched-tokens")
    add("--kv-cache-memory", type=parse_memory, help="vLLM --kv-cache-memory-bytes: a fixed KV pool")
    add("--num-gpu-blocks-override", type=parse_positive_int, help="vLLM --num-gpu-blocks-override")
    add("--activation-memory", type=parse_memory, help="activation peak (default 0.5GiB, or estimated)")
    add(
        "--overhead-memory", type=parse_memory, default=default(DEFAULT_OVERHEAD_BYTES), help="default 1.5GiB"
    )
    add(
        "--cpu-offload-gb",
        type=cpu_offload_gib,
        help="vLLM --cpu-offload-gb: GiB of layer weights per GPU kept in CPU memory (a number, as vLLM's)",
    )
    add(
        "--speculative-config",
        type=SpeculativeSettings.parse,
        help=(
            "vLLM --speculative-config (JSON): MTP layers, EAGLE, EAGLE-3 and draft models (their "
            '"model" read as --model is) are budgeted; ngram needs nothing'
        ),
    )
    add_lora_flags(group)


def cpu_offload_gib(text: str) -> int:
    """``--cpu-offload-gb``: vLLM's non-negative number of GiB, as bytes."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise UsageError(f"invalid --cpu-offload-gb {text!r}: give GiB as vLLM takes them, e.g. 10 or 2.5")
    return round(value * GIB)


def add_lora_flags(group: argparse._ArgumentGroup) -> None:
    """VLLM's ``--enable-lora`` settings that size its adapter slots (:mod:`sidecar.budget.lora`)."""
    add = group.add_argument
    add("--enable-lora", action="store_true", help="vLLM --enable-lora: budget its adapter slots")
    add(
        "--max-loras",
        type=parse_positive_int,
        help=f"vLLM --max-loras: adapters in one batch, a slot each (default {DEFAULT_MAX_LORAS})",
    )
    add(
        "--max-lora-rank",
        type=parse_positive_int,
        help=f"vLLM --max-lora-rank: {', '.join(map(str, LORA_RANKS))} (default {DEFAULT_MAX_LORA_RANK})",
    )
    add("--fully-sharded-loras", action="store_true", help="vLLM --fully-sharded-loras")
    add(
        "--lora-target-modules",
        nargs="+",
        metavar="MODULE",
        help="vLLM --lora-target-modules (0.20 on): only these layers get slots (o_proj q_proj ...)",
    )


def lora_slots_from_args(args: argparse.Namespace) -> LoraSlots | None:
    """The adapter slots the flags describe, ``None`` without ``--enable-lora``."""
    sizes = {
        "--max-loras": args.max_loras,
        "--max-lora-rank": args.max_lora_rank,
        "--fully-sharded-loras": args.fully_sharded_loras,
        "--lora-target-modules": args.lora_target_modules,
    }
    given = [flag for flag, value in sizes.items() if value]
    if not args.enable_lora:
        if given:
            raise UsageError(f"{given[0]} sizes LoRA adapter slots: add --enable-lora, as vLLM needs too")
        return None
    return LoraSlots(
        max_loras=args.max_loras or DEFAULT_MAX_LORAS,
        max_lora_rank=args.max_lora_rank or DEFAULT_MAX_LORA_RANK,
        fully_sharded=args.fully_sharded_loras,
        target_modules=frozenset(args.lora_target_modules) if args.lora_target_modules else None,
    )
