"""Lanes, outcomes and reasons: one vocabulary for metrics, logs and HTTP answers.

:class:`Reason` is at once the ``reason`` label of ``kv_sidecar_admission_total``, the
``reason`` field of a log line, the ``X-KV-Sidecar-Reason`` header and (through
:attr:`Reason.status`) the HTTP status of a refusal. Refusals come in two roots:
:class:`RefusedError` (decided before the request was queued) and :class:`DroppedError`
(the request waited in the queue and was then let go: timeout or drain).
"""

from __future__ import annotations

from enum import StrEnum

from sidecar.errors import KvSidecarError


class Lane(StrEnum):
    """Which lane a generation request travels in, by prompt size."""

    SHORT = "short"
    LONG = "long"


class Outcome(StrEnum):
    """How a generation request ended at the sidecar."""

    ADMITTED = "admitted"  # forwarded to the engine (whatever the engine then answered)
    REFUSED = "refused"  # answered by the sidecar before queueing
    DROPPED = "dropped"  # answered by the sidecar after waiting in the queue
    CANCELLED = "cancelled"  # the client went away while queued


class Reason(StrEnum):
    """Why: the label, the log field and the ``X-KV-Sidecar-Reason`` header."""

    ADMITTED = "admitted"
    QUEUED = "queued"  # admitted after waiting
    KV_PRESSURE = "kv-pressure"
    QUEUE_FULL = "queue-full"
    QUEUE_TIMEOUT = "queue-timeout"
    ENGINE_UNAVAILABLE = "engine-unavailable"
    ENGINE_ERROR = "engine-error"
    ENGINE_TIMEOUT = "engine-timeout"
    DRAINING = "draining"
    CONTEXT_LENGTH_EXCEEDED = "context-length-exceeded"
    BODY_TOO_LARGE = "body-too-large"
    BODY_TIMEOUT = "body-timeout"
    HEADER_TIMEOUT = "header-timeout"
    HEADERS_TOO_LARGE = "headers-too-large"
    INVALID_REQUEST = "invalid-request"
    CLIENT_DISCONNECTED = "client-disconnected"

    @property
    def status(self) -> int:
        """The HTTP status of a refusal for this reason."""
        return _STATUS[self]

    @property
    def error_type(self) -> str:
        """The OpenAI-style ``error.type``."""
        return _TYPE[self]


_STATUS = {
    Reason.ADMITTED: 200,
    Reason.QUEUED: 200,
    Reason.KV_PRESSURE: 429,
    Reason.QUEUE_FULL: 429,
    Reason.QUEUE_TIMEOUT: 503,
    Reason.ENGINE_UNAVAILABLE: 503,
    Reason.ENGINE_ERROR: 502,
    Reason.ENGINE_TIMEOUT: 504,
    Reason.DRAINING: 503,
    Reason.CONTEXT_LENGTH_EXCEEDED: 400,
    Reason.BODY_TOO_LARGE: 413,
    Reason.BODY_TIMEOUT: 408,
    Reason.HEADER_TIMEOUT: 408,
    Reason.HEADERS_TOO_LARGE: 431,
    Reason.INVALID_REQUEST: 400,
    Reason.CLIENT_DISCONNECTED: 499,
}
_TYPE = {
    Reason.KV_PRESSURE: "rate_limit_error",
    Reason.QUEUE_FULL: "rate_limit_error",
    Reason.QUEUE_TIMEOUT: "service_unavailable_error",
    Reason.ENGINE_UNAVAILABLE: "service_unavailable_error",
    Reason.ENGINE_ERROR: "api_error",
    Reason.ENGINE_TIMEOUT: "timeout_error",
    Reason.DRAINING: "service_unavailable_error",
    Reason.CONTEXT_LENGTH_EXCEEDED: "invalid_request_error",
    Reason.BODY_TOO_LARGE: "invalid_request_error",
    Reason.BODY_TIMEOUT: "invalid_request_error",
    Reason.HEADER_TIMEOUT: "invalid_request_error",
    Reason.HEADERS_TOO_LARGE: "invalid_request_error",
    Reason.INVALID_REQUEST: "invalid_request_error",
    Reason.CLIENT_DISCONNECTED: "client_disconnected",
    Reason.ADMITTED: "",
    Reason.QUEUED: "",
}


class AdmissionError(KvSidecarError):
    """A generation request the sidecar answers itself: reason, message, and seconds to wait."""

    outcome = Outcome.REFUSED

    def __init__(
        self, reason: Reason, message: str, retry_after: float | None = None, param: str | None = None
    ):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        self.param = param


class RefusedError(AdmissionError):
    """Refused before queueing (pressure in reject mode, queue full, never fits, bad body, draining)."""

    outcome = Outcome.REFUSED


class DroppedError(AdmissionError):
    """Let go after waiting in the queue (wait limit reached, or the sidecar is draining)."""

    outcome = Outcome.DROPPED


def reason_message(reason: Reason) -> str:
    """The one-line message of a refusal the controller decides itself."""
    if reason is Reason.KV_PRESSURE:
        return (
            "the KV cache has been above its pressure threshold; long prompts are refused until it recovers"
        )
    if reason is Reason.QUEUE_FULL:
        return "the admission queue is full; retry later"
    if reason is Reason.DRAINING:
        return "the sidecar is shutting down; retry on another replica"
    return reason.value
