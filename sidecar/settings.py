"""Settings types that the command line and the server edge share, and :func:`default_of` for the CLI.

Each concern has one settings type that owns its defaults and validation (``__post_init__``); the
command line takes its defaults from these types (never a second literal), and ``RunOptions``
composes them. This module imports no I/O library, so ``kv-sidecar plan`` stays fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sidecar.signals.engines import BY_KIND
from sidecar.signals.kinds import EngineKind
from sidecar.units import MIB

EVERYWHERE = "0.0.0.0"  # noqa: S104 - in a pod the sidecar serves the pod's address
LISTEN = (EVERYWHERE, 9000)
"""Where ``run`` takes client traffic by default."""
ADMIN_LISTEN = (EVERYWHERE, 9090)
"""Where ``run`` serves the admin endpoints by default."""
DRAIN_TIMEOUT_SECONDS = 30.0
"""How long in-flight requests may take to finish on SIGTERM, by default."""


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What the proxy and admin ports accept from clients, and how long the engine may stay silent."""

    max_body_bytes: int = 16 * MIB
    max_header_bytes: int = 64 * 1024
    body_timeout: float = 30.0
    header_timeout: float = 10.0  # a head is at most 8 KiB: real clients send it in well under this
    connect_timeout: float = 5.0
    upstream_keepalive: float = 4.0  # idle engine connections closed before vLLM's uvicorn closes them (5 s)
    upstream_timeout: float = 900.0  # longest silence from the engine: before its answer, or between chunks
    tenant_header: str = "X-Tenant-Id"
    priority_header: str = "X-KV-Sidecar-Priority"
    queue_timeout_header: str = "X-KV-Sidecar-Queue-Timeout"

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_header_bytes",
            "body_timeout",
            "header_timeout",
            "upstream_timeout",
            "upstream_keepalive",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not self.tenant_header.strip():
            raise ValueError("the tenant header needs a name")


@dataclass(frozen=True, slots=True)
class ScrapeSettings:
    """Interval, timeout and backoff of the scraper."""

    interval: float = 0.25  # each page costs vLLM ~15 ms of its API process: see the README (Design)
    calm_interval: float = 1.0
    """Between rounds while the sidecar is calm (capacity admission, usage below the release threshold and
    none beyond its ledger, no pressure, queued requests waiting only for sequence slots:
    ``SidecarApp._calm``): a page then tells admission nothing, and costs vLLM's API process all the same.
    Never below ``interval``."""
    timeout: float = 2.0
    max_backoff: float = 5.0
    engine: EngineKind | None = None  # None: whichever engine the page shows (vLLM when none)
    metrics_url: str | None = None  # None: the upstream's, at the engine's path

    def metrics_path(self) -> str:
        """The path of the engine's Prometheus page on the upstream."""
        if self.engine is None or self.engine is EngineKind.VLLM:
            return "/metrics"
        return BY_KIND[self.engine].metrics_path


def default_of(settings_type: type, name: str) -> Any:
    """The default a settings dataclass gives ``name`` (what the command line shows and uses)."""
    for item in dataclasses.fields(settings_type):
        if item.name == name:
            if item.default is not dataclasses.MISSING:
                return item.default
            if item.default_factory is not dataclasses.MISSING:
                return item.default_factory()
            raise ValueError(f"{settings_type.__name__}.{name} has no default")
    raise ValueError(f"{settings_type.__name__} has no setting {name!r}")
