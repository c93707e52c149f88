"""The flags of ``kv-sidecar``: their types, defaults and help, one adder per group.

:mod:`sidecar.cli` builds the parser from these adders and turns parsed flags into the settings
types; the parsing of single values (sizes, durations, URLs) lives in :mod:`sidecar.units`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from sidecar.admission.conversation import CONTENT_FORMATS, REASONING_EFFORTS, EngineChat
from sidecar.admission.decide import AdmissionConfig, AdmissionMode, OnPressure
from sidecar.admission.outputs import OutputSettings
from sidecar.admission.pressure import PressureSettings, Staleness
from sidecar.admission.tickets import QueueSettings
from sidecar.errors import UsageError
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.planning import MODEL_RETRY_SECONDS
from sidecar.settings import DRAIN_TIMEOUT_SECONDS, ClientLimits, ScrapeSettings, default_of
from sidecar.signals.kinds import EngineKind
from sidecar.units import (
    parse_duration,
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


def scrape_interval(text: str) -> float:
    """``--scrape-interval``: a duration of at least :data:`MIN_SCRAPE_INTERVAL`."""
    value = parse_duration(text)
    if value < MIN_SCRAPE_INTERVAL:
        raise UsageError(f"invalid scrape interval {text!r}: the minimum is 50ms")
    return value


def read_chat_template(value: str) -> str:
    """``--chat-template`` as vLLM 0.32 reads it (``_load_chat_template``): a file's text, else the value.

    The value itself counts as a template when it has a brace or a newline; anything else is a one-line error.
    """
    try:
        return Path(value).read_text()
    except OSError:
        if any(char in value for char in "{}\n"):
            return value
    raise UsageError(
        f"--chat-template {value!r} is neither a readable file nor a template (vLLM's built-in template "
        "names are not known here): give the file vLLM reads"
    )


def json_object(text: str, example: str = '{"enable_thinking": false}') -> dict[str, Any]:
    """``--default-chat-template-kwargs``: a JSON object, as vLLM reads it (``json.loads``)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise UsageError(f"{text!r} is not a JSON object: write it as vLLM takes it, e.g. '{example}'")
    return value


def effort_map(text: str) -> dict[str, str]:
    """``--reasoning-effort-map``: a JSON object from efforts to strings, checked as vLLM checks it.

    ``validate_reasoning_effort_map`` (``entrypoints/common/cli_args.py``, 0.33.0 and 0.34.0).
    """
    example = '{"medium": "low"}'
    given = json_object(text, example)
    if not all(isinstance(value, str) for value in given.values()):
        raise UsageError(f"{text!r} maps an effort to something other than a string: write e.g. '{example}'")
    if unknown := sorted(set(given) - set(REASONING_EFFORTS)):
        raise UsageError(
            f"--reasoning-effort-map has unknown efforts {unknown}: keys are {', '.join(REASONING_EFFORTS)}"
        )
    return given


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
        "--chat-template",
        help="vLLM's --chat-template (a file, or the template): chats are counted with it, not the model's",
    )
    add(
        "--chat-template-content-format",
        type=choice(*CONTENT_FORMATS),
        default=CONTENT_FORMATS[0],
        help="vLLM's --chat-template-content-format (default %(default)s)",
    )
    add(
        "--default-chat-template-kwargs",
        type=json_object,
        help="vLLM's --default-chat-template-kwargs (JSON): template variables a request does not set",
    )
    add(
        "--reasoning-effort-map",
        type=effort_map,
        help="vLLM's --reasoning-effort-map (JSON, vLLM 0.33+): efforts rewritten before rendering",
    )
    add(
        "--exclude-tools-when-tool-choice-none",
        action="store_true",
        help="vLLM runs with this flag: a chat with tool_choice none is counted without its tools",
    )
    add(
        "--tokenizer-mode",
        default=default_of(EngineChat, "tokenizer_mode"),
        help="vLLM's --tokenizer-mode: counts are exact only where vLLM uses the model's tokenizer.json "
        "and chat template (hf, or auto as vLLM resolves it); near for mistral, deepseek_v32, ... "
        "(default %(default)s)",
    )
    add(
        "--tokenizer",
        help="vLLM's --tokenizer (a folder or Hugging Face id): prompts are counted with its tokenizer and "
        "templates, from the HF cache as --model (default: --model's)",
    )
    add("--tokenizer-revision", help="vLLM's --tokenizer-revision (default: --revision, as vLLM)")
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
