"""The pressure detector: has the KV cache been full for a while, not just for a moment.

Theory of operation
-------------------
A small state machine fed one KV-usage sample per scrape, with the time of the sample:

* ``NORMAL`` -> ``PRESSURE`` once usage has been ``>= enter_threshold`` (default 0.85) on every
  sample for at least ``window`` seconds (default 5 s): the clock starts at the first sample at or
  above the threshold and restarts at any sample below it. A single spike does not count.
* ``PRESSURE`` -> ``NORMAL`` once usage has been ``< release_threshold`` (default 0.80) on every
  sample for ``window`` seconds. The gap between the thresholds is hysteresis: usage hovering
  around 0.85 does not flap the state.
* Stale or missing samples (``usage is None``, or the caller says the metrics are stale) do not
  move the state machine; :meth:`PressureDetector.effective` then answers by the stale policy:
  ``open`` admits as if ``NORMAL`` (the policy's own limits still hold), ``closed`` acts as if
  ``PRESSURE``. Whether the metrics are stale is :class:`Staleness`'s answer, asked with the
  clock's time *at each decision* (metrics go stale between scrapes too, when a scrape hangs), and
  the same object answers ``/readyz``: there is one copy of the stale policy.

Everything is pure: times come in as arguments, nothing reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PressureState(StrEnum):
    """The detector's state."""

    NORMAL = "normal"
    PRESSURE = "pressure"


class StaleMode(StrEnum):
    """What admission and readiness do while the engine's metrics are stale."""

    OPEN = "open"  # admit as if calm; /readyz stays 200
    CLOSED = "closed"  # act as if under pressure; /readyz answers 503


@dataclass(frozen=True, slots=True)
class Staleness:
    """When the engine's metrics stop counting, and the policy then: the one copy of both."""

    after: float = 3.0
    policy: StaleMode = StaleMode.OPEN

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", StaleMode(self.policy))
        if self.after <= 0:
            raise ValueError("stale-after must be positive")

    def is_stale(self, up: bool | None, age: float | None) -> bool:
        """Whether metrics of ``age`` seconds from an engine that is ``up`` are stale."""
        return not up or age is None or age > self.after


@dataclass(frozen=True, slots=True)
class PressureSettings:
    """Thresholds and window."""

    enter_threshold: float = 0.85
    release_threshold: float = 0.80
    window: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.release_threshold <= self.enter_threshold <= 1:
            raise ValueError("thresholds must satisfy 0 < release <= pressure <= 1")
        if self.window < 0:
            raise ValueError("the pressure window cannot be negative")


class PressureDetector:
    """See the module docstring."""

    def __init__(self, settings: PressureSettings) -> None:
        self.settings = settings
        self.state = PressureState.NORMAL
        self.transitions = 0
        self.stale = True  # no sample yet
        self._above_since: float | None = None
        self._below_since: float | None = None
        self.last_usage: float | None = None

    def observe(self, now: float, usage: float | None, *, stale: bool = False) -> PressureState:
        """Feed one sample taken at ``now``; returns the (raw) state afterwards."""
        self.stale = stale or usage is None
        if self.stale or usage is None:
            return self.state
        self.last_usage = usage
        settings = self.settings
        self._above_since = (
            (self._above_since if self._above_since is not None else now)
            if (usage >= settings.enter_threshold)
            else None
        )
        self._below_since = (
            (self._below_since if self._below_since is not None else now)
            if (usage < settings.release_threshold)
            else None
        )
        if (
            self.state is PressureState.NORMAL
            and self._above_since is not None
            and now - self._above_since >= settings.window
        ):
            self.state = PressureState.PRESSURE
            self.transitions += 1
        elif (
            self.state is PressureState.PRESSURE
            and self._below_since is not None
            and now - self._below_since >= settings.window
        ):
            self.state = PressureState.NORMAL
            self.transitions += 1
        return self.state

    def effective(self, stale: bool, policy: StaleMode) -> PressureState:
        """The state admission acts on: the raw state, or the stale policy's answer while ``stale``."""
        if stale:
            return PressureState.PRESSURE if policy is StaleMode.CLOSED else PressureState.NORMAL
        return self.state


@dataclass(slots=True)
class ConcurrencyCap:
    """The seeds' rule under sustained pressure: lower the concurrency one step and let requests queue.

    Entering pressure caps admission one below what is in flight; each pressure window the usage stays at
    or above the release threshold lowers the cap one more step (never below one); leaving pressure lifts it.
    """

    value: int | None = None
    changed_at: float = 0.0

    def update(self, now: float, *, pressure: bool, inflight: int, detector: PressureDetector) -> None:
        """Move the cap for the state at ``now``."""
        if not pressure:
            self.value = None
            return
        settings = detector.settings
        if self.value is None:
            self.value, self.changed_at = max(1, inflight - 1), now
        elif (
            now - self.changed_at >= settings.window
            and (detector.last_usage or 0.0) >= settings.release_threshold
        ):
            self.value, self.changed_at = max(1, self.value - 1), now
