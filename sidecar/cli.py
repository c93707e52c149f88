"""The ``kv-sidecar`` command line.

Every flag can also be set through the environment as ``KV_SIDECAR_<FLAG>`` (upper case, dashes
to underscores, e.g. ``KV_SIDECAR_MAX_MODEL_LEN=32768``); a flag on the command line wins. Bad
input ends with one line on stderr naming the problem and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

from sidecar import __version__
from sidecar.budget import (
    PlanRequest,
    advise,
    build_ledger,
    ledger_to_dict,
    render_table,
    resolve_gpu,
    resolve_model,
)
from sidecar.budget.ledger import DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_OVERHEAD_BYTES
from sidecar.errors import KvSidecarError, UsageError
from sidecar.units import parse_positive_int, parse_ratio, parse_size

EXIT_USAGE = 2
ENV_PREFIX = "KV_SIDECAR_"


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors become one-line usage errors."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise UsageError(f"invalid value {text!r}: use one of {', '.join(choices)}")
        return value

    return parse


def add_deployment_flags(parser: argparse.ArgumentParser) -> None:
    """Flags that describe the deployment: shared by ``plan``, ``run`` and ``check``."""
    group = parser.add_argument_group("model and vLLM settings")
    group.add_argument(
        "--model", help="catalog id (qwen2.5-7b), Hugging Face id, model directory or config.json"
    )
    group.add_argument(
        "--gpu", help="catalog GPU id: rtx3090, rtx4090, l4, a10, l40s, rtx-a6000, a100-40gb, ..."
    )
    group.add_argument(
        "--gpu-memory", type=parse_size, help="GPU memory instead of --gpu, e.g. 24GiB or 80GB"
    )
    weight = _choice("bf16", "fp16", "fp8", "int8", "int4")
    group.add_argument("--weight-dtype", type=weight, help="weight dtype (default: the checkpoint's)")
    group.add_argument(
        "--kv-cache-dtype",
        type=_choice("auto", "bf16", "fp16", "fp8", "int8", "int4"),
        default="auto",
        help="KV cache dtype (default: auto = the model's dtype)",
    )
    group.add_argument(
        "--max-model-len", type=parse_positive_int, help="tokens per sequence (default: the model's)"
    )
    group.add_argument(
        "--concurrency",
        type=parse_positive_int,
        default=1,
        help="sequences that must fit at full length (default 1)",
    )
    group.add_argument(
        "--gpu-memory-utilization",
        type=parse_ratio,
        default=DEFAULT_GPU_MEMORY_UTILIZATION,
        help=f"vLLM's share of GPU memory (default {DEFAULT_GPU_MEMORY_UTILIZATION})",
    )
    group.add_argument("--tensor-parallel-size", type=parse_positive_int, default=1, help="GPUs per engine")
    group.add_argument(
        "--block-size",
        type=parse_positive_int,
        default=DEFAULT_BLOCK_SIZE,
        help="tokens per KV block (default 16)",
    )
    group.add_argument("--max-num-seqs", type=parse_positive_int, help="vLLM --max-num-seqs")
    group.add_argument(
        "--max-num-batched-tokens", type=parse_positive_int, help="vLLM --max-num-batched-tokens"
    )
    group.add_argument(
        "--activation-memory", type=parse_size, help="activation peak (default: 0.5GiB or estimated)"
    )
    group.add_argument(
        "--overhead-memory",
        type=parse_size,
        default=DEFAULT_OVERHEAD_BYTES,
        help="framework overhead (default 1.5GiB)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full ``kv-sidecar`` argument parser."""
    parser = _Parser(prog="kv-sidecar", description="Keep vLLM's KV cache out of the red.")
    parser.add_argument("--version", action="version", version=f"kv-sidecar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan = commands.add_parser("plan", help="predict the memory budget of a deployment")
    add_deployment_flags(plan)
    plan.add_argument("--format", type=_choice("table", "json"), default="table", help="output format")
    plan.set_defaults(handler=_cmd_plan)
    return parser


def plan_request_from_args(args: argparse.Namespace) -> PlanRequest:
    """Turn parsed deployment flags into a :class:`PlanRequest`."""
    if not args.model:
        raise UsageError(
            "--model is required: a catalog id such as qwen2.5-7b, a model directory or a config.json"
        )
    if args.gpu_memory is not None:
        gpu_name, gpu_memory = (args.gpu or "custom"), args.gpu_memory
    elif args.gpu:
        gpu = resolve_gpu(args.gpu)
        gpu_name, gpu_memory = gpu.id, gpu.memory_bytes
    else:
        raise UsageError("give --gpu (e.g. rtx4090) or --gpu-memory (e.g. 24GiB)")
    return PlanRequest(
        architecture=resolve_model(args.model),
        gpu_memory_bytes=gpu_memory,
        model=args.model,
        gpu=gpu_name,
        weight_dtype=args.weight_dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        concurrency=args.concurrency,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        activation_bytes=args.activation_memory,
        overhead_bytes=args.overhead_memory,
    )


def _cmd_plan(args: argparse.Namespace) -> int:
    request = plan_request_from_args(args)
    ledger = build_ledger(request)
    options = advise(request)
    if args.format == "json":
        print(json.dumps(ledger_to_dict(ledger, options), indent=2))
    else:
        print(render_table(ledger, options))
    return 0


def _apply_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Make ``KV_SIDECAR_<FLAG>`` variables the defaults of the matching flags (recursively)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _apply_environment(sub, environ)
            continue
        long_flags = [s for s in action.option_strings if s.startswith("--")]
        if not long_flags or action.dest in {"help", "version"}:
            continue
        name = ENV_PREFIX + long_flags[0][2:].upper().replace("-", "_")
        if name not in environ:
            continue
        raw = environ[name]
        if isinstance(action, argparse._StoreTrueAction):
            action.default = raw.strip().lower() in {"1", "true", "yes", "on"}
            continue
        try:
            action.default = action.type(raw) if callable(action.type) else raw
        except KvSidecarError as exc:
            raise UsageError(f"{name}: {exc}") from None


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    try:
        _apply_environment(parser, os.environ if environ is None else environ)
        args = parser.parse_args(argv)
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except KvSidecarError as exc:
        print(f"kv-sidecar: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
