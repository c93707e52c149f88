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
from typing import Any

from sidecar import __version__
from sidecar.admission.pressure import StaleMode, Staleness
from sidecar.budget import (
    PlanRequest,
    advise,
    build_ledger,
    ledger_to_dict,
    render_table,
    resolve_gpu,
    resolve_model,
)
from sidecar.budget.catalog import ResolvedModel, resolve_drafter, resolve_model_source
from sidecar.deployment_flags import add_deployment_flags, lora_slots_from_args, vllm_variables
from sidecar.errors import ConfigError, KvSidecarError, UsageError
from sidecar.flags import (
    Parser,
    add_admission_flags,
    add_engine_flags,
    choice,
    engine_kind,
    read_chat_template,
    scrape_interval,
)
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.planning import PlanInputs
from sidecar.settings import ADMIN_LISTEN, LISTEN, ScrapeSettings, default_of
from sidecar.units import (
    parse_listen,
)

EXIT_USAGE = 2
ENV_PREFIX = "KV_SIDECAR_"


def build_parser() -> Parser:
    """The full ``kv-sidecar`` argument parser."""
    parser = Parser(prog="kv-sidecar", description="Keep vLLM's KV cache out of the red.")
    parser.add_argument("--version", action="version", version=f"kv-sidecar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    plan = parser.add_command(commands, "plan", help="predict the memory budget of a deployment")
    add_deployment_flags(plan)
    plan.add_argument("--format", type=choice("table", "json"), default="table", help="output format")
    plan.set_defaults(handler=_cmd_plan)

    run = parser.add_command(commands, "run", help="the admission proxy and the monitor, in front of vLLM")
    add_engine_flags(run)
    run.add_argument(
        "--listen",
        type=parse_listen,
        default=LISTEN,
        help=f"client traffic (host:port; default {LISTEN[0]}:{LISTEN[1]})",
    )
    run.add_argument(
        "--admin-listen",
        type=parse_listen,
        default=ADMIN_LISTEN,
        help=f"admin endpoints (host:port; default {ADMIN_LISTEN[0]}:{ADMIN_LISTEN[1]})",
    )
    run.add_argument(
        "--no-proxy", action="store_true", help="run the monitor alone, without the admission proxy"
    )
    run.add_argument(
        "--scrape-interval",
        type=scrape_interval,
        default=default_of(ScrapeSettings, "interval"),
        help="default %(default)ss (minimum 50ms)",
    )
    run.add_argument(
        "--calm-scrape-interval",
        type=scrape_interval,
        default=default_of(ScrapeSettings, "calm_interval"),
        help="under capacity admission while nothing waits here for KV blocks and usage is below the release "
        "threshold (default %(default)ss; never below --scrape-interval)",
    )
    run.add_argument(
        "--stale-policy",
        type=choice(*StaleMode),
        default=default_of(Staleness, "policy").value,
        help="when metrics are stale: " + ", ".join(StaleMode) + " (default %(default)s)",
    )
    add_admission_flags(run)
    add_deployment_flags(run, engine_fills_in=True)
    run.set_defaults(handler=_cmd_run)

    check = parser.add_command(
        commands, "check", help="one scrape, compared with the prediction; non-zero exit if wrong"
    )
    add_engine_flags(check)
    check.add_argument("--format", type=choice("table", "json"), default="table", help="output format")
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
    return {
        **vllm_variables(os.environ),  # vLLM's own, read as vLLM reads them
        "vllm_version": args.vllm_version,
        "enforce_eager": args.enforce_eager,
        "async_scheduling": args.async_scheduling,
        "enable_prefix_caching": args.enable_prefix_caching,
        "mamba_ssm_cache_dtype": args.mamba_ssm_cache_dtype,
        "mamba_cache_dtype": args.mamba_cache_dtype,
        "cuda_graph_bytes": args.cuda_graph_memory,
        "lora": lora_slots_from_args(args),
        "cpu_offload_bytes": args.cpu_offload_gb or 0,
        "speculative": resolve_drafter(args.speculative_config),  # reads a drafter model's config
        "weight_dtype": args.weight_dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_model_len": args.max_model_len,
        "concurrency": args.concurrency,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "tensor_parallel_size": args.tensor_parallel_size,
        "pipeline_parallel_size": args.pipeline_parallel_size,
        "data_parallel_size": args.data_parallel_size,
        "enable_expert_parallel": args.enable_expert_parallel,
        "block_size": args.block_size or 0,  # 0: the release's default
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
            pipeline_parallel_size=inputs.pipeline_parallel_size,
            data_parallel_size=inputs.data_parallel_size or 1,
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
    from sidecar.admission.conversation import EngineChat  # noqa: PLC0415
    from sidecar.admission.decide import AdmissionConfig  # noqa: PLC0415
    from sidecar.admission.outputs import OutputSettings  # noqa: PLC0415
    from sidecar.admission.pressure import PressureSettings  # noqa: PLC0415
    from sidecar.app import RunOptions, SidecarApp  # noqa: PLC0415
    from sidecar.logs import make_logger  # noqa: PLC0415
    from sidecar.server.counting import separate_tokenizer  # noqa: PLC0415
    from sidecar.settings import ClientLimits  # noqa: PLC0415

    if args.release_threshold > args.pressure_threshold:
        raise UsageError("--release-threshold must not exceed --pressure-threshold")
    if args.listen == args.admin_listen and not args.no_proxy:
        raise UsageError("--listen and --admin-listen must differ: admin endpoints have their own port")
    resolved, model_error = resolve_run_model(args)
    inputs = plan_inputs_from_args(args, resolved)
    folder = resolved.directory if resolved else None
    tokenizer, resolve_later = separate_tokenizer(
        args.tokenizer, args.tokenizer_revision or args.revision, folder
    )
    options = RunOptions(
        upstream=args.upstream,
        admin_listen=args.admin_listen,
        listen=args.listen,
        proxy=not args.no_proxy,
        scrape=ScrapeSettings(
            interval=args.scrape_interval,
            calm_interval=args.calm_scrape_interval,
            timeout=args.scrape_timeout,
            engine=engine_kind(args.engine),
            metrics_url=args.engine_metrics,
        ),
        nvml=args.nvml != "off",
        staleness=Staleness(after=args.stale_after, policy=args.stale_policy),
        outputs=OutputSettings(quantile=args.output_quantile, stream_interval=args.stream_interval),
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
        limits=ClientLimits(
            max_body_bytes=args.max_body_bytes,
            body_timeout=args.body_timeout,
            header_timeout=args.header_timeout,
            tenant_header=args.tenant_header,
            upstream_timeout=args.upstream_timeout,
        ),
        tokenizer_model=str(resolved.directory) if resolved and resolved.directory else args.model,
        tokenizer=tokenizer,
        chat=EngineChat(
            template=read_chat_template(args.chat_template) if args.chat_template else None,
            content_format=args.chat_template_content_format,
            exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
            default_template_kwargs=args.default_chat_template_kwargs or {},
            tokenizer_mode=args.tokenizer_mode,
            reasoning_effort_map=args.reasoning_effort_map or {},
        ),
        admin_token=args.admin_token or None,
        model_retry=args.model_retry,
    )
    app = SidecarApp(
        options,
        inputs,
        monitor_settings_from_args(args, inputs),
        make_logger(level=args.log_level),
        resolve_model=lambda: resolve_model_source(args.model, args.revision),
        model_error=model_error,
        resolve_tokenizer=resolve_later,
    )
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(app.serve())
    except OSError as exc:
        raise UsageError(f"cannot listen: {exc.strerror or exc}") from None
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop: uvloop's when it is installed (the ``fast`` extra), else asyncio's own."""
    try:
        import uvloop  # noqa: PLC0415 - optional
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _cmd_check(args: argparse.Namespace) -> int:
    from sidecar.check import run_check  # noqa: PLC0415 - keeps 'plan' free of HTTP imports

    inputs = plan_inputs_from_args(args)
    return asyncio.run(run_check(args, inputs, monitor_settings_from_args(args, inputs)))


SCRIPT_VARIABLES = frozenset({"KV_SIDECAR_CACHE", "KV_SIDECAR_VLLM_VENV", "KV_SIDECAR_TRANSFORMERS_VERSION"})
"""``KV_SIDECAR_*`` variables the project's scripts read (scripts/install-vllm), not flags."""
_TRUE, _FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off", ""})


def _apply_environment(parser: Parser, environ: Mapping[str, str]) -> set[str]:
    """Make ``KV_SIDECAR_<FLAG>`` variables the defaults of the matching flags (recursively).

    Returns the variable names that name a flag somewhere. A boolean flag's variable must read as
    true (``1``, ``true``, ``yes``, ``on``) or false (``0``, ``false``, ``no``, ``off``, empty); anything
    else is an error rather than a silent false. The flags are the ones :class:`Parser` recorded.
    """
    known: set[str] = set()
    for command in parser.commands:
        known |= _apply_environment(command, environ)
    for action in parser.flags:
        long_flags = [s for s in action.option_strings if s.startswith("--")]
        if not long_flags or action.dest in {"help", "version"}:
            continue
        name = ENV_PREFIX + long_flags[0][2:].upper().replace("-", "_")
        known.add(name)
        if name not in environ:
            continue
        raw = environ[name]
        if action.nargs == 0:  # a switch (store_true): the variable says on or off
            value = raw.strip().lower()
            if value not in _TRUE | _FALSE:
                raise UsageError(f"{name}={raw!r} is not a boolean: use 1/true/yes/on or 0/false/no/off")
            action.default = value in _TRUE
            continue
        action.required = False
        try:
            action.default = action.type(raw) if callable(action.type) else raw
        except KvSidecarError as exc:
            raise UsageError(f"{name}: {exc}") from None
    return known


def _warn_unknown_variables(known: set[str], environ: Mapping[str, str]) -> None:
    """One line on stderr for each ``KV_SIDECAR_*`` variable that names no flag (a typo, a removed flag)."""
    for name in sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in known | SCRIPT_VARIABLES):
        print(f"kv-sidecar: warning: {name} names no flag; ignored", file=sys.stderr)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    try:
        variables = os.environ if environ is None else environ
        _warn_unknown_variables(_apply_environment(parser, variables), variables)
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
