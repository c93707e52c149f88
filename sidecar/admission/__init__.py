"""Admission: which generation requests go to the engine now, which wait, which are refused, and why.

The pure core decides (``capacity``: the block ledger, ``decide``: the lanes and token-budget rules,
``pressure``: sustained KV pressure and staleness, ``outputs``: learned answer lengths, ``queue``: the
fair queue, ``retry``: ``Retry-After``); :class:`AdmissionController` is the async part that makes
requests wait. It reports through :class:`AdmissionRecorder` and imports no metrics library.
"""

from sidecar.admission.body import RequestFacts, request_facts
from sidecar.admission.controller import AdmissionController
from sidecar.admission.decide import AdmissionConfig, AdmissionMode
from sidecar.admission.outcomes import AdmissionError, Lane, Outcome, Reason, RefusedError
from sidecar.admission.outputs import OutputSettings
from sidecar.admission.pressure import PressureSettings, PressureState, StaleMode, Staleness
from sidecar.admission.recorder import AdmissionRecorder
from sidecar.admission.tickets import QueueSettings, Ticket

__all__ = [
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionError",
    "AdmissionMode",
    "AdmissionRecorder",
    "Lane",
    "Outcome",
    "OutputSettings",
    "PressureSettings",
    "PressureState",
    "QueueSettings",
    "Reason",
    "RefusedError",
    "RequestFacts",
    "StaleMode",
    "Staleness",
    "Ticket",
    "request_facts",
]
