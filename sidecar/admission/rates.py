"""Two observed rates admission plans with: the engine's step clock and the pool's block release rate. Pure.

* :class:`StepClock`: vLLM counts its engine steps (``vllm:iteration_tokens_total``, a histogram
  observed once per step; its ``_count``). Each scrape gives the true count. Between scrapes the
  *upper* bound runs on at the highest step rate seen since the engine started (x 1.1), so it never
  lags what the engine has done (lagging would make in-flight requests look younger, and smaller,
  than they are); the *lower* bound is the count the last scrape read, or the count a streamed answer
  has proved since (:meth:`StepClock.at_least`: vLLM sends a stream at most one event a step, so a
  stream's events since the count read before its admission are steps the engine ran), never
  extrapolated: a step can take any time (a long prefill, a host busy with other work; measured here, a
  250 ms window's rate was no bound for the next), so a request is never taken to be further along
  (closer to its end) than it is. A counter that goes down is an engine restart: the clock starts over,
  and what streams proved with it. Its *pace*
  (:meth:`StepClock.pace`) only times the next scrape, never a decision: the rate over the last
  :data:`PACE_WINDOW_SECONDS` of scrapes, or between the last two when that was faster. Between two
  scrapes 50 ms apart the rate read 0 to 60 steps a second on the mid-size spike while the engine ran
  ~300 (one long prefill step, or none), and a scrape timed by it came up to an interval late.
* :class:`ReleaseRate`: blocks given back by finished requests per second over the last
  ``window`` seconds: how fast the queue can drain, the basis of ``Retry-After``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Steps:
    """The engine's step clock at decision time: a lower and an upper bound, each ``None`` if unknown."""

    low: float | None = None
    high: float | None = None
    at: float = 0.0  # the sidecar's clock these bounds are for
    top_rate: float | None = None  # the most steps a second (the margin included); None: unknown
    ahead: float = 0.0  # steps taken to have run beyond ``at`` (a look ahead, not a reading)

    def later(self, ahead: float) -> Steps:
        """The bounds once ``ahead`` more steps have run."""
        return Steps(
            None if self.low is None else self.low + ahead,
            None if self.high is None else self.high + ahead,
            self.at,
            self.top_rate,
            self.ahead + ahead,
        )

    def most_since(self, then: float) -> float | None:
        """The most steps the engine can have run since the sidecar's clock read ``then`` (None: unknown)."""
        if self.top_rate is None:
            return None
        return max(0.0, self.at - then) * self.top_rate + self.ahead


RATE_MARGIN = 1.1
"""The upper bound runs this much faster than the fastest rate seen (an over-estimate is safe)."""
RELEASE_WINDOW_SECONDS = 30.0
PACE_WINDOW_SECONDS = 1.0
"""The span of scrapes :meth:`StepClock.pace` averages over."""


@dataclass(slots=True)
class StepClock:
    """The engine's step count, extrapolated between scrapes (see the module docstring)."""

    _last: tuple[float, float] | None = None  # (time, steps) of the last scrape
    max_rate: float = 0.0  # steps per second
    recent_rate: float = 0.0  # steps per second between the last two scrapes
    _recent: deque[tuple[float, float]] = field(default_factory=deque)  # (time, steps) over the pace window
    floor: float | None = None  # a count streams proved the engine reached (at_least); kept until a restart

    def observe(self, now: float, steps: float | None) -> None:
        """A scrape at ``now`` read ``steps``."""
        if steps is None:
            return
        if self._last is not None:
            then, before = self._last
            if steps < before:  # the engine restarted
                self.max_rate = self.recent_rate = 0.0
                self._recent.clear()
                self.floor = None
            elif now > then:
                self.recent_rate = (steps - before) / (now - then)
                self.max_rate = max(self.max_rate, self.recent_rate)
        self._last = (now, steps)
        self._recent.append((now, steps))
        while len(self._recent) > 2 and now - self._recent[1][0] >= PACE_WINDOW_SECONDS:
            self._recent.popleft()  # keep the newest sample at least a window old

    def at_least(self, steps: float) -> bool:
        """The engine has certainly run to ``steps`` (a stream says so); whether the lower bound rose."""
        if self._last is None or steps <= self._low(self._last[1]):
            return False
        self.floor = steps
        return True

    def _low(self, scraped: float) -> float:
        return scraped if self.floor is None else max(scraped, self.floor)

    def steps_within(self, seconds: float) -> float | None:
        """The most steps the engine runs in ``seconds`` (its top rate x the margin); ``None``: unknown."""
        top_rate = self.top_rate()
        return None if top_rate is None else seconds * top_rate

    def top_rate(self) -> float | None:
        """The most steps a second the engine is taken to run: its fastest seen x the margin, or None."""
        return self.max_rate * RATE_MARGIN if self.max_rate > 0.0 else None

    def age(self, now: float) -> float:
        """Seconds since the last scrape's count was read (0 before any)."""
        return 0.0 if self._last is None else max(0.0, now - self._last[0])

    def pace(self) -> float:
        """Steps per second to time the next scrape by (0 before two scrapes): see the module docstring."""
        if len(self._recent) < 2:
            return self.recent_rate
        (first, before), (last, steps) = self._recent[0], self._recent[-1]
        windowed = (steps - before) / (last - first) if last > first else 0.0
        return max(windowed, self.recent_rate)

    def bounds(self, now: float) -> Steps:
        """The step count at ``now``, from below and from above (see the module docstring)."""
        if self._last is None:
            return Steps(at=now)
        then, steps = self._last
        low = self._low(steps)
        if (top_rate := self.top_rate()) is None:
            return Steps(low=low, at=now)
        high = max(low, steps + max(0.0, now - then) * top_rate)
        return Steps(low=low, high=high, at=now, top_rate=top_rate)


@dataclass(slots=True)
class ReleaseRate:
    """Blocks released per second over a sliding window."""

    window: float = RELEASE_WINDOW_SECONDS
    _events: deque[tuple[float, int]] = field(default_factory=deque)

    def record(self, now: float, blocks: int) -> None:
        """A request that held ``blocks`` ended at ``now``."""
        self._events.append((now, blocks))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][0] > self.window:
            self._events.popleft()

    def per_second(self, now: float) -> float | None:
        """The release rate, or ``None`` with fewer than two releases in the window.

        The blocks released after the window's first release, over the time since it: the first
        release marks the start of the measured span, so it is not counted in it.
        """
        self._trim(now)
        if len(self._events) < 2:
            return None
        span = max(now - self._events[0][0], 1e-3)
        return sum(blocks for _, blocks in list(self._events)[1:]) / span

    def requests_per_second(self, now: float) -> float | None:
        """Requests finished per second over the window (the same span), or ``None`` with fewer than two."""
        self._trim(now)
        if len(self._events) < 2:
            return None
        return (len(self._events) - 1) / max(now - self._events[0][0], 1e-3)
