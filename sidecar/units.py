"""Parsing and formatting of the units the CLI accepts: sizes, durations and ratios.

Sizes accept binary (``KiB``, ``MiB``, ``GiB``, ``TiB``) and decimal (``KB``, ``MB``, ``GB``,
``TB``) suffixes or plain bytes; durations accept ``ms``, ``s``, ``m``, ``h`` or plain seconds;
ratios are fractions. All functions are pure and raise :class:`~sidecar.errors.UsageError`
with a one-line message on bad input.
"""

from __future__ import annotations

import math
import re
import urllib.parse

from sidecar.errors import UsageError

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "ki": KIB,
    "mi": MIB,
    "gi": GIB,
    "ti": TIB,
    "k": KIB,  # 24G as in nvidia-smi, free -g and Kubernetes' own "G" users write: binary, like Gi
    "m": MIB,
    "g": GIB,
    "t": TIB,
}
_DURATION_UNITS: dict[str, float] = {"": 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER_WITH_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a memory size such as ``24GiB``, ``80GB``, ``512MiB`` or ``1073741824`` into bytes."""
    match = _NUMBER_WITH_UNIT.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise UsageError(
            f"invalid size {text!r}: use a number with KiB/MiB/GiB/TiB (or K/M/G/T, the same) or KB/MB/GB/TB"
        )
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"invalid size {text!r}: it must be greater than zero")
    return int(value)


def parse_memory(text: str) -> int:
    """Parse a GPU-scale memory size: as :func:`parse_size`, but a bare number below 1 MiB is refused.

    ``--gpu-memory 24`` is 24 bytes to :func:`parse_size`; nobody means that, so say what they do mean.
    """
    value = parse_size(text)
    match = _NUMBER_WITH_UNIT.match(text)
    if match is not None and not match.group(2) and value < MIB:
        raise UsageError(f"invalid size {text!r}: a bare number is bytes; write the unit: {text.strip()}GiB")
    return value


def parse_upstream(text: str) -> str:
    """VLLM's base URL: a scheme and a host, no ``/v1`` (the OpenAI base URL), no query; no trailing slash."""
    url = urllib.parse.urlsplit(text.strip())
    if url.scheme not in {"http", "https"} or not url.netloc:
        raise UsageError(
            f"invalid --upstream {text!r}: give vLLM's URL with its scheme, e.g. http://127.0.0.1:8000"
        )
    path = url.path.rstrip("/")
    if path.endswith("/v1"):
        root = f"{url.scheme}://{url.netloc}{path.removesuffix('/v1')}"
        raise UsageError(
            f"--upstream {text!r} is the OpenAI base URL: give vLLM's root, {root} (paths keep their /v1)"
        )
    if url.query or url.fragment:
        raise UsageError(f"invalid --upstream {text!r}: no query or fragment, just vLLM's URL")
    return f"{url.scheme}://{url.netloc}{path}"


def parse_metrics_url(text: str) -> str:
    """``--engine-metrics``: a full ``http(s)://`` URL of the engine's Prometheus page."""
    url = urllib.parse.urlsplit(text.strip())
    if url.scheme not in {"http", "https"} or not url.netloc:
        raise UsageError(
            f"invalid --engine-metrics {text!r}: give the page's full URL, e.g. http://127.0.0.1:8002/metrics"
        )
    return text.strip()


def parse_duration(text: str) -> float:
    """Parse a duration such as ``500ms``, ``5s``, ``2m`` or ``0.5`` (seconds) into seconds."""
    match = _NUMBER_WITH_UNIT.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _DURATION_UNITS:
        raise UsageError(
            f"invalid duration {text!r}: use seconds or a number with ms/s/m/h, e.g. 500ms or 5s"
        )
    return float(match.group(1)) * _DURATION_UNITS[unit]


def positive_duration(text: str) -> float:
    """A duration greater than zero."""
    value = parse_duration(text)
    if value <= 0:
        raise UsageError(f"invalid duration {text!r}: it must be greater than zero")
    return value


def parse_ratio(text: str) -> float:
    """Parse a fraction in (0, 1], such as ``0.85``."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"invalid ratio {text!r}: give a fraction such as 0.9") from None
    if not 0.0 < value <= 1.0:
        raise UsageError(f"invalid ratio {text!r}: it must be greater than 0 and at most 1")
    return value


def parse_positive_int(text: str) -> int:
    """Parse a whole number greater than zero (``32768``, ``32_768`` or ``32k`` for 32768)."""
    cleaned = text.strip().replace("_", "").lower()
    multiplier = 1
    if cleaned.endswith("k"):
        multiplier, cleaned = 1024, cleaned[:-1]
    try:
        value = int(cleaned) * multiplier
    except ValueError:
        raise UsageError(f"invalid number {text!r}: give a whole number such as 4 or 32768") from None
    if value <= 0:
        raise UsageError(f"invalid number {text!r}: it must be greater than zero")
    return value


def format_gib(num_bytes: float) -> str:
    """Format bytes as GiB with two decimals, e.g. ``7.00 GiB``."""
    return f"{num_bytes / GIB:,.2f} GiB"


def parse_listen(text: str) -> tuple[str, int]:
    """Parse ``host:port`` (``0.0.0.0:9000``, ``[::1]:9090``, ``:9000``) into a host and a port."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"invalid address {text!r}: use host:port, e.g. 0.0.0.0:9000")
    return (host.strip("[]") or "0.0.0.0"), int(port_text)  # noqa: S104 - listening on all interfaces is the default
