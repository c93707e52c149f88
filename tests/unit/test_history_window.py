"""The history answers "sustained" and "increase" from the interval asked about, as a whole-window scan would.

The history keeps ten minutes of scrapes (several thousand under load) and the diagnoses ask about the last
minute on every scrape; the questions now read the interval from the newest end instead of the whole window.
A property test holds them to the plain definitions on random histories (values missing, counters reset).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from sidecar.monitor.history import Observation, SignalHistory


def _sustained(
    items: list[Observation], now: float, duration: float, holds: Callable[[Observation], bool]
) -> bool:
    if not items or now - items[0].at < duration:
        return False
    start = now - duration
    recent = [o for o in items if o.at >= start]
    anchor = [o for o in items if o.at < start][-1:]
    return bool(recent or anchor) and all(holds(o) for o in anchor + recent)


def _increase(items: list[Observation], now: float, duration: float) -> float:
    start = now - duration
    points = [o.preemptions_total for o in items if o.at >= start and o.preemptions_total is not None]
    before = [o.preemptions_total for o in items if o.at < start and o.preemptions_total is not None][-1:]
    series = before + points
    return sum(b - a if b >= a else b for a, b in itertools.pairwise(series))


observations = st.lists(
    st.tuples(
        st.floats(0, 5, allow_nan=False),  # the gap since the previous scrape
        st.one_of(st.none(), st.floats(0, 1)),
        st.one_of(st.none(), st.integers(0, 20).map(float)),
    ),
    max_size=40,
)


@given(observations, st.floats(0, 120, allow_nan=False), st.floats(0, 60, allow_nan=False))
def test_the_interval_read_from_the_newest_end_answers_as_the_whole_window(
    points: list[tuple[float, float | None, float | None]], later: float, duration: float
) -> None:
    history, at = SignalHistory(window=50), 0.0
    for gap, usage, preemptions in points:
        at += gap
        history.add(Observation(at=at, kv_usage=usage, preemptions_total=preemptions))
    now, kept = at + later, history.observations()

    def high(o: Observation) -> bool:
        return o.kv_usage is not None and o.kv_usage >= 0.5

    assert history.sustained(now, duration, high) == _sustained(kept, now, duration, high)
    assert history.increase(now, duration, lambda o: o.preemptions_total) == _increase(kept, now, duration)
