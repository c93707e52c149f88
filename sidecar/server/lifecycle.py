"""The process's lifecycle flags, owned by the application and read by the proxy and the admin server."""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.admission.pressure import Staleness


@dataclass(slots=True)
class Lifecycle:
    """Process-wide flags the admin endpoints report; owned by the application."""

    draining: bool = False
    staleness: Staleness = field(default_factory=Staleness)
