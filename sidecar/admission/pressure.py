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
  ``open`` admits as if ``NORMAL`` (the long-lane cap still holds), ``closed`` acts as if
  ``PRESSURE``.

Everything is pure: times come in as arguments, nothing reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PressureState(StrEnum):
    """The detector's state."""

    NORMAL = "normal"
    PRESSURE = "pressure"


@dataclass(frozen=True, slots=True)
class PressureSettings:
    """Thresholds, window and stale policy."""

    enter_threshold: float = 0.85
    release_threshold: float = 0.80
    window: float = 5.0
    stale_policy: str = "open"


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

    def mark_stale(self) -> None:
        """The metrics went stale (engine unreachable): stop trusting the last sample."""
        self.stale = True

    @property
    def effective(self) -> PressureState:
        """The state admission acts on: the raw state, or the stale policy's answer while stale."""
        if self.stale:
            return PressureState.PRESSURE if self.settings.stale_policy == "closed" else PressureState.NORMAL
        return self.state
