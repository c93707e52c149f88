"""A short, pure history of engine and GPU signals, for "sustained" and "increasing" questions.

The scraper appends one :class:`Observation` per successful scrape with the time it was taken
(from an injected monotonic clock); the history drops what is older than its window. Every
question takes ``now`` explicitly, so tests can ask "exactly at the window" and "just past it".
A condition is *sustained* over ``duration`` only when the history reaches back at least that
far (the oldest kept observation is at least ``duration`` old) and every observation inside the
interval satisfies it.
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar.monitor.gpu import GpuSnapshot
    from sidecar.signals.vllm import EngineSnapshot


@dataclass(frozen=True, slots=True)
class Observation:
    """The signals of one scrape at monotonic time ``at``."""

    at: float
    kv_usage: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None
    gpu_used_bytes: int | None = None


class SignalHistory:
    """Observations within the last ``window`` seconds."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._items: deque[Observation] = deque()

    def add(self, observation: Observation) -> None:
        """Append an observation and forget the ones older than the window (keeping one as an anchor)."""
        self._items.append(observation)
        horizon = observation.at - self.window
        while len(self._items) > 1 and self._items[1].at <= horizon:
            self._items.popleft()

    def __len__(self) -> int:
        return len(self._items)

    def observations(self) -> list[Observation]:
        """The kept observations, oldest first."""
        return list(self._items)

    def _since(self, start: float) -> list[Observation]:
        """The observations at or after ``start``, oldest first, read from the newest end.

        A question about the last minute reads that minute, not the whole window (ten minutes of scrapes,
        several thousand under load, on every scrape).
        """
        recent = list(itertools.takewhile(lambda o: o.at >= start, reversed(self._items)))
        recent.reverse()
        return recent

    def _last_before(self, start: float, value: Callable[[Observation], float | None]) -> float | None:
        """``value`` of the newest observation before ``start`` that has one."""
        older = itertools.dropwhile(lambda o: o.at >= start, reversed(self._items))
        return next((v for o in older if (v := value(o)) is not None), None)

    def sustained(self, now: float, duration: float, condition: Callable[[Observation], bool]) -> bool:
        """Whether ``condition`` held on every observation of the last ``duration`` seconds."""
        if not self._items or now - self._items[0].at < duration:
            return False
        start = now - duration
        recent = self._since(start)
        older = len(self._items) - len(recent)
        anchor = [self._items[older - 1]] if older else []  # the value in force when the interval began
        return bool(recent or anchor) and all(condition(o) for o in [*anchor, *recent])

    def increase(self, now: float, duration: float, value: Callable[[Observation], float | None]) -> float:
        """How much a counter grew over the last ``duration`` seconds (resets count from zero)."""
        start = now - duration
        points = [v for o in self._since(start) if (v := value(o)) is not None]
        before = self._last_before(start, value)
        series = ([] if before is None else [before]) + points
        growth = 0.0
        for previous, current in itertools.pairwise(series):
            growth += current - previous if current >= previous else current
        return growth

    def peak_and_steady(self, value: Callable[[Observation], float | None]) -> tuple[float, float] | None:
        """The maximum and the median of ``value`` over the window, or ``None`` without data."""
        values = [v for o in self._items if (v := value(o)) is not None]
        if not values:
            return None
        return max(values), statistics.median(values)


def observation(at: float, snapshot: EngineSnapshot | None, gpus: list[GpuSnapshot]) -> Observation:
    """The history record for one scrape."""
    used = sum(g.used_bytes for g in gpus) // len(gpus) if gpus else None
    if snapshot is None:
        return Observation(at=at, gpu_used_bytes=used)
    return Observation(
        at=at,
        kv_usage=snapshot.kv_usage,
        waiting=snapshot.waiting,
        preemptions_total=snapshot.preemptions_total,
        gpu_used_bytes=used,
    )
