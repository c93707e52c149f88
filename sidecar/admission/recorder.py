"""What admission reports about itself, as a protocol: the admission core imports no metrics library.

The server layer implements it with Prometheus families (``sidecar.server.metrics.AdmissionMetrics``);
tests may pass anything with these four methods. The values are the same enums the responses and logs
use (:mod:`sidecar.admission.outcomes`), so a label, a log field and a status never disagree.
"""

from __future__ import annotations

from typing import Protocol

from sidecar.admission.outcomes import Lane, Outcome, Reason
from sidecar.admission.pressure import PressureState


class AdmissionRecorder(Protocol):
    """Where admission records outcomes, queue waits, pressure transitions and learned answers."""

    def outcome(self, outcome: Outcome, reason: Reason, lane: Lane) -> None:
        """A generation request ended this way (exactly once per request)."""

    def queue_wait(self, lane: Lane, seconds: float) -> None:
        """A request left the queue of ``lane`` after ``seconds``, however it left."""

    def transition(self, state: PressureState) -> None:
        """The pressure state changed to ``state``."""

    def output_sample(self, source: str) -> None:
        """An answer's length was learned from ``source`` (``usage`` or ``stream``)."""
