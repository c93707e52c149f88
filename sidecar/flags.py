"""The flags of ``kv-sidecar``: their types, defaults and help, one adder per group.

:mod:`sidecar.cli` builds the parser from these adders and turns parsed flags into the settings
types; the parsing of single values (sizes, durations, URLs) lives in :mod:`sidecar.units`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from sidecar.admission.decide import AdmissionConfig, AdmissionMode, OnPressure
from sidecar.admission.outputs import OutputSettings
from sidecar.admission.pressure import PressureSettings, Staleness
from sidecar.admission.tickets import QueueSettings
from sidecar.budget.dtypes import KV_DTYPES, normalise_dtype
from sidecar.budget.ledger import DEFAULT_BLOCK_SIZE, DEFAULT_OVERHEAD_BYTES, PlanRequest
from sidecar.budget.vllm_release import NEWEST_MODELLED, VllmRelease
from sidecar.errors import UsageError
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.planning import MODEL_RETRY_SECONDS
from sidecar.settings import DRAIN_TIMEOUT_SECONDS, ClientLimits, ScrapeSettings, default_of
from sidecar.signals.kinds import EngineKind
from sidecar.units import (
    parse_duration,
    parse_memory,
    parse_metrics_url,
    parse_positive_int,
    parse_ratio,
    parse_size,
    parse_upstream,
    positive_duration,
)

MIN_SCRAPE_INTERVAL = 0.05
AUTO_ENGINE = "auto"


def engine_kind(value: str) -> EngineKind | None:
    """``--engine``'s value as the scraper takes it (``None``: decided by the page)."""
    return None if value == AUTO_ENGINE else EngineKind(value)


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors become one-line usage errors, and which lists its own flags.

    argparse has no public way to enumerate a parser's actions, so this one records them as they are
    added (``add_argument`` returns the action, on the parser and on its argument groups) together
    with its sub-command parsers: the ``KV_SIDECAR_*`` overlay reads :attr:`flags` and
    :attr:`commands` instead of argparse's internals.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flags: list[argparse.Action] = []  # before argparse's own __init__ adds --help
        self.commands: list[Parser] = []
        self._recording_groups = False  # argparse's __init__ makes its own groups, used internally
        super().__init__(*args, **kwargs)
        self._recording_groups = True

    def error(self, message: str) -> NoReturn:
        """Raise the message as a :class:`UsageError` (one line, exit status 2)."""
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Add a flag, and record it."""
        action = super().add_argument(*args, **kwargs)
        self.flags.append(action)
        return action

    def add_argument_group(self, *args: Any, **kwargs: Any) -> Any:
        """An argument group whose flags are recorded on this parser."""
        group = super().add_argument_group(*args, **kwargs)
        return _RecordingGroup(group, self.flags) if self._recording_groups else group

    def add_command(self, commands: Any, name: str, **kwargs: Any) -> Parser:
        """``commands.add_parser(name)`` (``commands`` from :meth:`add_subparsers`), recorded."""
        sub: Parser = commands.add_parser(name, **kwargs)
        self.commands.append(sub)
        return sub


class _RecordingGroup:
    """An argparse argument group that records the flags added to it."""

    def __init__(self, group: Any, flags: list[argparse.Action]) -> None:
        self._group = group
        self._flags = flags

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Add a flag to the group, and record it."""
        action: argparse.Action = self._group.add_argument(*args, **kwargs)
        self._flags.append(action)
        return action


def choice(*choices: str) -> Callable[[str], str]:
    """A flag type accepting one of ``choices`` (case-insensitive)."""

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise UsageError(f"invalid value {text!r}: use one of {', '.join(choices)}")
        return value

    return parse


def vllm_version(text: str) -> str:
    """``--vllm-version``: normalised to ``major.minor.patch``."""
    return str(VllmRelease.parse(text))


def kv_dtype(text: str) -> str:
    """``--kv-cache-dtype``: ours or vLLM's spelling (``fp8_e4m3`` and ``fp8_e5m2`` are both 1-byte FP8)."""
    value = normalise_dtype(text)
    if value not in {"auto", *KV_DTYPES}:
        raise UsageError(
            f"invalid KV cache dtype {text!r}: use auto, {', '.join(KV_DTYPES)} or fp8_e4m3/fp8_e5m2"
        )
    return value


def scrape_interval(text: str) -> float:
    """``--scrape-interval``: a duration of at least :data:`MIN_SCRAPE_INTERVAL`."""
    value = parse_duration(text)
    if value < MIN_SCRAPE_INTERVAL:
        raise UsageError(f"invalid scrape interval {text!r}: the minimum is 50ms")
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
        type=choice("bf16", "fp16", "fp8", "int8", "int4"),
        help="default: the checkpoint's",
    )
    add(
        "--kv-cache-dtype",
        type=kv_dtype,
        default=default("auto"),
        help="KV cache dtype: auto (the model's), bf16, fp16, fp8, int8, int4, or vLLM's spellings "
        "(bfloat16, fp8_e4m3, fp8_e5m2, ...)",
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
    block_default = default(DEFAULT_BLOCK_SIZE)
    add("--block-size", type=parse_positive_int, default=block_default, help="tokens per KV block")
    add(
        "--vllm-version",
        type=vllm_version,
        default=None if engine_fills_in else NEWEST_MODELLED,
        help=f"the vLLM release whose defaults and profiling rules apply (default {NEWEST_MODELLED}"
        + (", or what the engine's /version says)" if engine_fills_in else ")"),
    )
    add("--enforce-eager", action="store_true", help="vLLM --enforce-eager: no CUDA graphs to budget")
    add(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=default_of(PlanRequest, "async_scheduling"),  # not on the engine's page: never engine-filled
        help="vLLM --[no-]async-scheduling: from 0.26 a sliding-window cap counts two batches in flight "
        "with it (on by default on GPUs; vLLM's CPU platform turns it off)",
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


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """How to reach vLLM and GPUs: shared by ``run`` and ``check``."""
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--upstream",
        required=True,
        type=parse_upstream,
        help="vLLM's URL, e.g. http://127.0.0.1:8000 (not .../v1)",
    )
    group.add_argument(
        "--engine",
        type=choice(AUTO_ENGINE, *EngineKind),
        default=AUTO_ENGINE,
        help=f"the model server behind --upstream: {AUTO_ENGINE} (what its page shows), "
        + ", ".join(EngineKind)
        + " (default %(default)s)",
    )
    group.add_argument(
        "--engine-metrics",
        type=parse_metrics_url,
        help="the engine's Prometheus page when not at --upstream's (Triton: http://127.0.0.1:8002/metrics)",
    )
    group.add_argument(
        "--scrape-timeout",
        type=positive_duration,
        default=default_of(ScrapeSettings, "timeout"),
        help="per scrape (default %(default)ss)",
    )
    group.add_argument("--nvml", type=choice("auto", "off"), default="auto", help="read GPUs through NVML")
    group.add_argument(
        "--sustain-window",
        type=positive_duration,
        default=default_of(MonitorSettings, "sustain_seconds"),
        help="how long 'sustained' is (default %(default)ss)",
    )
    group.add_argument("--log-level", type=choice("debug", "info", "warning", "error"), default="info")


def add_admission_flags(parser: argparse.ArgumentParser) -> None:
    """The proxy's admission, queue and limits (``run``)."""
    group = parser.add_argument_group("admission (proxy)")
    add = group.add_argument
    limits, pressure, queue, admission = ClientLimits, PressureSettings, QueueSettings, AdmissionConfig
    add(
        "--max-body-bytes",
        type=parse_size,
        default=default_of(limits, "max_body_bytes"),
        help="request body limit (413 above; default %(default)s bytes)",
    )
    add(
        "--body-timeout",
        type=positive_duration,
        default=default_of(limits, "body_timeout"),
        help="time to receive a request body (408; default %(default)ss)",
    )
    add(
        "--header-timeout",
        type=positive_duration,
        default=default_of(limits, "header_timeout"),
        help="time to receive a request's head once it starts (408, connection closed; default %(default)ss)",
    )
    add(
        "--pressure-threshold",
        type=parse_ratio,
        default=default_of(pressure, "enter_threshold"),
        help="KV usage that means pressure (default %(default)s)",
    )
    add(
        "--release-threshold",
        type=parse_ratio,
        default=default_of(pressure, "release_threshold"),
        help="KV usage that ends pressure (default %(default)s)",
    )
    add(
        "--pressure-window",
        type=positive_duration,
        default=default_of(pressure, "window"),
        help="how long usage must hold (default %(default)ss)",
    )
    add(
        "--stale-after",
        type=positive_duration,
        default=default_of(Staleness, "after"),
        help="metrics older than this are stale (default %(default)ss)",
    )
    add("--long-prompt-tokens", type=parse_positive_int, help="long-lane threshold (default max_model_len/2)")
    add(
        "--long-lane-concurrency",
        type=parse_positive_int,
        default=default_of(admission, "long_lane_concurrency"),
        help="long requests at once (default %(default)s)",
    )
    add(
        "--on-pressure",
        type=choice(*OnPressure),
        default=default_of(admission, "on_pressure").value,
        help="long prompts under pressure: " + ", ".join(OnPressure) + " (default %(default)s)",
    )
    add(
        "--admission",
        type=choice(*AdmissionMode),
        default=default_of(admission, "mode").value,
        help="capacity (admit what fits the KV pool, block-exactly), lanes (the seeds' long lane), "
        "token-budget (reserve prompt + max_tokens); default %(default)s",
    )
    add(
        "--output-quantile",
        type=parse_ratio,
        default=default_of(OutputSettings, "quantile"),
        help="capacity: expected output = this quantile of observed answer lengths per route and model "
        "(default %(default)s)",
    )
    add(
        "--stream-interval",
        type=parse_positive_int,
        default=default_of(OutputSettings, "stream_interval"),
        help="vLLM --stream-interval: above 1, a stream without usage teaches no answer length "
        "(default %(default)s)",
    )
    add(
        "--queue-max-entries",
        type=parse_positive_int,
        default=default_of(queue, "max_entries"),
        help="per lane (default %(default)s)",
    )
    add(
        "--queue-max-tokens",
        type=parse_positive_int,
        default=default_of(queue, "max_tokens"),
        help="per lane (default %(default)s)",
    )
    add(
        "--queue-timeout",
        type=positive_duration,
        default=default_of(queue, "timeout"),
        help="longest wait in the queue (default %(default)ss)",
    )
    add(
        "--drain-timeout",
        type=positive_duration,
        default=DRAIN_TIMEOUT_SECONDS,
        help="time for in-flight requests on SIGTERM (default %(default)ss)",
    )
    add(
        "--tenant-header",
        default=default_of(limits, "tenant_header"),
        help="header naming the tenant, else a hash of the API key (default %(default)s)",
    )
    add(
        "--upstream-timeout",
        type=positive_duration,
        default=default_of(limits, "upstream_timeout"),
        help="longest silence from vLLM (504 after; default %(default)ss)",
    )
    add(
        "--model-retry",
        type=positive_duration,
        default=MODEL_RETRY_SECONDS,
        help="how often to try again a --model that did not resolve (default %(default)ss)",
    )
    add(
        "--admin-token",
        help="bearer token for the admin endpoints but the probes (prefer KV_SIDECAR_ADMIN_TOKEN)",
    )
