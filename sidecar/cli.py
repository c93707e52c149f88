"""The ``kv-sidecar`` command line: ``plan``, ``run`` and ``check``.

Every flag can also be set through the environment as ``KV_SIDECAR_<FLAG>`` (upper case, dashes
to underscores, e.g. ``KV_SIDECAR_MAX_MODEL_LEN=32768``); a flag on the command line wins. Bad
input ends with one line on stderr naming the problem and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

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
from sidecar.budget.catalog import ResolvedModel, resolve_model_source
from sidecar.budget.dtypes import KV_DTYPES, normalise_dtype
from sidecar.budget.ledger import DEFAULT_BLOCK_SIZE, DEFAULT_OVERHEAD_BYTES
from sidecar.budget.vllm_release import NEWEST_MODELLED, VllmRelease
from sidecar.errors import ConfigError, KvSidecarError, UsageError
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.planning import MODEL_RETRY_SECONDS, PlanInputs
from sidecar.units import (
    parse_duration,
    parse_listen,
    parse_memory,
    parse_positive_int,
    parse_ratio,
    parse_size,
)

EXIT_USAGE = 2
ENV_PREFIX = "KV_SIDECAR_"
MIN_SCRAPE_INTERVAL = 0.05


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


def _vllm_version(text: str) -> str:
    return str(VllmRelease.parse(text))


def _kv_dtype(text: str) -> str:
    """``--kv-cache-dtype``: ours or vLLM's spelling (``fp8_e4m3`` and ``fp8_e5m2`` are both 1-byte FP8)."""
    value = normalise_dtype(text)
    if value not in {"auto", *KV_DTYPES}:
        raise UsageError(
            f"invalid KV cache dtype {text!r}: use auto, {', '.join(KV_DTYPES)} or fp8_e4m3/fp8_e5m2"
        )
    return value


def _scrape_interval(text: str) -> float:
    value = parse_duration(text)
    if value < MIN_SCRAPE_INTERVAL:
        raise UsageError(f"invalid scrape interval {text!r}: the minimum is 50ms")
    return value


def _positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise UsageError(f"invalid duration {text!r}: it must be greater than zero")
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
        type=_choice("bf16", "fp16", "fp8", "int8", "int4"),
        help="default: the checkpoint's",
    )
    add(
        "--kv-cache-dtype",
        type=_kv_dtype,
        default=default("auto"),
        help="KV cache dtype: auto (the model's), bf16, fp16, fp8, int8, int4, or vLLM's spellings "
        "(bfloat16, fp8_e4m3, fp8_e5m2, ...)",
    )
    add(
        "--max-model-len",
        type=parse_positive_int,
        help="tokens per sequence (default: the model's or engine's)",
    )
    add("--concurrency", type=parse_positive_int, default=1, help="sequences that must fit at full length")
    add(
        "--gpu-memory-utilization",
        type=parse_ratio,
        help="vLLM's share of GPU memory (default: the release's, 0.92 from vLLM 0.20, else 0.9)",
    )
    add("--tensor-parallel-size", type=parse_positive_int, default=1, help="GPUs per engine")
    add(
        "--block-size",
        type=parse_positive_int,
        default=default(DEFAULT_BLOCK_SIZE),
        help="tokens per KV block",
    )
    add(
        "--vllm-version",
        type=_vllm_version,
        default=None if engine_fills_in else NEWEST_MODELLED,
        help=f"the vLLM release whose defaults and profiling rules apply (default {NEWEST_MODELLED}"
        + (", or what the engine's /version says)" if engine_fills_in else ")"),
    )
    add("--enforce-eager", action="store_true", help="vLLM --enforce-eager: no CUDA graphs to budget")
    add("--cuda-graph-memory", type=parse_memory, help="a measured CUDA-graph figure (default 0.5GiB)")
    add("--max-num-seqs", type=parse_positive_int, help="vLLM --max-num-seqs")
    add("--max-num-batched-tokens", type=parse_positive_int, help="vLLM --max-num-batched-tokens")
    add("--kv-cache-memory", type=parse_memory, help="vLLM --kv-cache-memory-bytes: a fixed KV pool")
    add("--num-gpu-blocks-override", type=parse_positive_int, help="vLLM --num-gpu-blocks-override")
    add("--activation-memory", type=parse_memory, help="activation peak (default 0.5GiB, or estimated)")
    add(
        "--overhead-memory", type=parse_memory, default=default(DEFAULT_OVERHEAD_BYTES), help="default 1.5GiB"
    )


def _add_engine_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    group.add_argument("--upstream", required=True, help="vLLM's base URL, e.g. http://127.0.0.1:8000")
    group.add_argument(
        "--scrape-timeout", type=_positive_duration, default=2.0, help="per scrape (default 2s)"
    )
    group.add_argument("--nvml", type=_choice("auto", "off"), default="auto", help="read GPUs through NVML")
    group.add_argument(
        "--sustain-window",
        type=_positive_duration,
        default=60.0,
        help="how long 'sustained' is (default 60s)",
    )
    group.add_argument("--log-level", type=_choice("debug", "info", "warning", "error"), default="info")


def _add_admission_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("admission (proxy)")
    add = group.add_argument
    add("--max-body-bytes", type=parse_size, default=16 * 1024 * 1024, help="request body limit (413 above)")
    add("--body-timeout", type=_positive_duration, default=30.0, help="time to receive a request body (408)")
    add(
        "--pressure-threshold",
        type=parse_ratio,
        default=0.85,
        help="KV usage that means pressure (default 0.85)",
    )
    add(
        "--release-threshold",
        type=parse_ratio,
        default=0.80,
        help="KV usage that ends pressure (default 0.80)",
    )
    add(
        "--pressure-window",
        type=_positive_duration,
        default=5.0,
        help="how long usage must hold (default 5s)",
    )
    add("--stale-after", type=_positive_duration, default=3.0, help="metrics older than this are stale")
    add("--long-prompt-tokens", type=parse_positive_int, help="long-lane threshold (default max_model_len/2)")
    add(
        "--long-lane-concurrency",
        type=parse_positive_int,
        default=1,
        help="long requests at once (default 1)",
    )
    add("--on-pressure", type=_choice("queue", "reject"), default="queue", help="long prompts under pressure")
    add(
        "--admission",
        type=_choice("capacity", "lanes", "token-budget"),
        default="capacity",
        help="capacity (default: admit what fits the KV pool, block-exactly), lanes (the seeds' long lane), "
        "token-budget (reserve prompt + max_tokens)",
    )
    add(
        "--output-quantile",
        type=parse_ratio,
        default=0.95,
        help="capacity: expected output = this quantile of observed answer lengths per route and model "
        "(default 0.95)",
    )
    add("--queue-max-entries", type=parse_positive_int, default=1024, help="per lane (default 1024)")
    add("--queue-max-tokens", type=parse_positive_int, default=4_000_000, help="per lane (default 4M)")
    add(
        "--queue-timeout",
        type=_positive_duration,
        default=30.0,
        help="longest wait in the queue (default 30s)",
    )
    add(
        "--drain-timeout",
        type=_positive_duration,
        default=30.0,
        help="time for in-flight requests on SIGTERM",
    )
    add(
        "--tenant-header", default="X-Tenant-Id", help="header naming the tenant (else a hash of the API key)"
    )
    add(
        "--upstream-timeout",
        type=_positive_duration,
        default=900.0,
        help="longest silence from vLLM (504 after)",
    )
    add(
        "--model-retry",
        type=_positive_duration,
        default=MODEL_RETRY_SECONDS,
        help="how often to try again a --model that did not resolve (default %(default)ss)",
    )
    add(
        "--admin-token",
        help="bearer token for the admin endpoints but the probes (prefer KV_SIDECAR_ADMIN_TOKEN)",
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

    run = commands.add_parser("run", help="the admission proxy and the monitor, in front of vLLM")
    _add_engine_flags(run)
    everywhere = "0.0.0.0"  # noqa: S104 - in a pod the sidecar serves the pod's address
    run.add_argument(
        "--listen", type=parse_listen, default=(everywhere, 9000), help="client traffic (host:port)"
    )
    run.add_argument(
        "--admin-listen", type=parse_listen, default=(everywhere, 9090), help="admin (host:port)"
    )
    run.add_argument(
        "--no-proxy", action="store_true", help="run the monitor alone, without the admission proxy"
    )
    run.add_argument(
        "--scrape-interval", type=_scrape_interval, default=0.1, help="default 100ms (minimum 50ms)"
    )
    run.add_argument(
        "--stale-policy", type=_choice("open", "closed"), default="open", help="when metrics are stale"
    )
    _add_admission_flags(run)
    add_deployment_flags(run, engine_fills_in=True)
    run.set_defaults(handler=_cmd_run)

    check = commands.add_parser(
        "check", help="one scrape, compared with the prediction; non-zero exit if wrong"
    )
    _add_engine_flags(check)
    check.add_argument("--format", type=_choice("table", "json"), default="table", help="output format")
    add_deployment_flags(check, engine_fills_in=True)
    check.set_defaults(handler=_cmd_check)
    return parser


def _gpu_from_args(args: argparse.Namespace) -> tuple[str, int | None]:
    if args.gpu_memory is not None and args.gpu:
        raise UsageError("give --gpu or --gpu-memory, not both: --gpu already says the memory")
    if args.gpu_memory is not None:
        return args.gpu or "custom", args.gpu_memory
    if args.gpu:
        gpu = resolve_gpu(args.gpu)
        return gpu.id, gpu.memory_bytes
    return "custom", None


def _deployment_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The deployment flags shared by :class:`PlanRequest` and :class:`PlanInputs`, by field name."""
    allow_long = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in {"1", "true"}
    return {
        "allow_long_max_model_len": allow_long,  # read as vLLM's envs.py reads it
        "vllm_version": args.vllm_version,
        "enforce_eager": args.enforce_eager,
        "cuda_graph_bytes": args.cuda_graph_memory,
        "weight_dtype": args.weight_dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_model_len": args.max_model_len,
        "concurrency": args.concurrency,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "tensor_parallel_size": args.tensor_parallel_size,
        "block_size": args.block_size,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "activation_bytes": args.activation_memory,
        "overhead_bytes": args.overhead_memory,
        "kv_cache_memory_bytes": args.kv_cache_memory,
        "num_gpu_blocks_override": args.num_gpu_blocks_override,
    }


def plan_request_from_args(args: argparse.Namespace) -> PlanRequest:
    """Turn parsed ``plan`` flags into a :class:`PlanRequest`."""
    if not args.model:
        raise UsageError(
            "--model is required: a catalog id such as qwen2.5-7b, a model directory or a config.json"
        )
    gpu_name, gpu_memory = _gpu_from_args(args)
    if gpu_memory is None:
        raise UsageError("give --gpu (e.g. rtx4090) or --gpu-memory (e.g. 24GiB)")
    return PlanRequest(
        architecture=resolve_model(args.model, args.revision),
        gpu_memory_bytes=gpu_memory,
        model=args.model,
        gpu=gpu_name,
        **_deployment_settings(args),
    )


def resolve_run_model(args: argparse.Namespace) -> tuple[ResolvedModel | None, str | None]:
    """``--model`` for ``run``: what it resolved to, or why not (``run`` goes on without a prediction)."""
    if not args.model:
        return None, None
    try:
        return resolve_model_source(args.model, args.revision), None
    except ConfigError as exc:
        return None, str(exc)


def plan_inputs_from_args(args: argparse.Namespace, resolved: ResolvedModel | None = None) -> PlanInputs:
    """Turn parsed ``run``/``check`` flags into :class:`PlanInputs` (``None`` where not given)."""
    gpu_name, gpu_memory = _gpu_from_args(args)
    if resolved is None and args.model and args.command != "run":
        resolved = resolve_model_source(args.model, args.revision)
    inputs = PlanInputs(
        architecture=resolved.architecture if resolved else None,
        model=args.model or "model",
        gpu=gpu_name,
        gpu_memory_bytes=gpu_memory,
        **_deployment_settings(args),
    )
    if inputs.architecture is not None and inputs.gpu_memory_bytes is not None:
        PlanRequest(  # validate the combination now, so bad flags fail at start-up with one line
            inputs.architecture,
            inputs.gpu_memory_bytes,
            weight_dtype=inputs.weight_dtype,
            concurrency=inputs.concurrency,
            tensor_parallel_size=inputs.tensor_parallel_size,
        )
    return inputs


def monitor_settings_from_args(args: argparse.Namespace, inputs: PlanInputs) -> MonitorSettings:
    """The diagnosis settings for ``run``/``check``."""
    return MonitorSettings(
        target_concurrency=args.concurrency,
        requested_kv_dtype=args.kv_cache_dtype,
        model_dtype=inputs.architecture.dtype if inputs.architecture else None,
        sustain_seconds=args.sustain_window,
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


def _cmd_run(args: argparse.Namespace) -> int:
    from sidecar.admission.controller import QueueSettings  # noqa: PLC0415 - keeps 'plan' free of server imports
    from sidecar.admission.decide import AdmissionConfig  # noqa: PLC0415
    from sidecar.admission.outputs import OutputSettings  # noqa: PLC0415
    from sidecar.admission.pressure import PressureSettings, Staleness  # noqa: PLC0415
    from sidecar.app import RunOptions, SidecarApp  # noqa: PLC0415
    from sidecar.logs import make_logger  # noqa: PLC0415
    from sidecar.monitor.scraper import ScrapeSettings  # noqa: PLC0415

    if args.release_threshold > args.pressure_threshold:
        raise UsageError("--release-threshold must not exceed --pressure-threshold")
    if args.listen == args.admin_listen and not args.no_proxy:
        raise UsageError("--listen and --admin-listen must differ: admin endpoints have their own port")
    resolved, model_error = resolve_run_model(args)
    inputs = plan_inputs_from_args(args, resolved)
    options = RunOptions(
        upstream=args.upstream,
        admin_listen=args.admin_listen,
        listen=args.listen,
        proxy=not args.no_proxy,
        scrape=ScrapeSettings(interval=args.scrape_interval, timeout=args.scrape_timeout),
        nvml=args.nvml != "off",
        staleness=Staleness(after=args.stale_after, policy=args.stale_policy),
        outputs=OutputSettings(quantile=args.output_quantile),
        drain_timeout=args.drain_timeout,
        admission=AdmissionConfig(
            long_prompt_tokens=args.long_prompt_tokens,
            long_lane_concurrency=args.long_lane_concurrency,
            on_pressure=args.on_pressure,
            mode=args.admission,
        ),
        pressure=PressureSettings(
            enter_threshold=args.pressure_threshold,
            release_threshold=args.release_threshold,
            window=args.pressure_window,
        ),
        queue=QueueSettings(
            max_entries=args.queue_max_entries, max_tokens=args.queue_max_tokens, timeout=args.queue_timeout
        ),
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        tenant_header=args.tenant_header,
        tokenizer_model=str(resolved.directory) if resolved and resolved.directory else args.model,
        admin_token=args.admin_token or None,
        upstream_timeout=args.upstream_timeout,
        model_retry=args.model_retry,
    )
    app = SidecarApp(
        options,
        inputs,
        monitor_settings_from_args(args, inputs),
        make_logger(level=args.log_level),
        resolve_model=lambda: resolve_model_source(args.model, args.revision),
        model_error=model_error,
    )
    try:
        asyncio.run(app.serve())
    except OSError as exc:
        raise UsageError(f"cannot listen: {exc.strerror or exc}") from None
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from sidecar.check import run_check  # noqa: PLC0415 - keeps 'plan' free of HTTP imports

    inputs = plan_inputs_from_args(args)
    return asyncio.run(run_check(args, inputs, monitor_settings_from_args(args, inputs)))


def _apply_environment(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Make ``KV_SIDECAR_<FLAG>`` variables the defaults of the matching flags (recursively).

    argparse has no public API to enumerate actions, so this reads ``_actions`` (stable since 2.7).
    """
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
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
        if isinstance(action, argparse._StoreTrueAction):  # noqa: SLF001
            action.default = raw.strip().lower() in {"1", "true", "yes", "on"}
            continue
        action.required = False
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
    except BrokenPipeError:  # `kv-sidecar plan | head -1`: the reader left; end quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
