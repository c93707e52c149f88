"""``Retry-After``: how long a refused client should wait, computed from what the sidecar observes.

* **Capacity-based** (``queue-full``, ``queue-timeout`` under the ``capacity`` policy): a request
  at queue position ``p`` starts once the blocks of the ``p`` requests ahead of it and its own have
  been released, beyond those free now: ``(ahead + own - free) / r`` with ``r`` the observed release
  rate of blocks (per second, over the last 30 s of completions). Before two releases have been
  seen, the queue-based estimate below stands in.
* **Queue-based** (``queue-full``, ``queue-timeout``): the lane serves ``concurrency`` requests at a
  time and each takes the lane's recent mean service time ``s`` (an exponentially weighted mean of
  the last completions); a client at position ``p`` waits about ``(p + 1) x s / concurrency``.
* **Pressure-based** (``kv-pressure``): pressure ends once KV usage has stayed under the release
  threshold for the window. With KV usage falling at rate ``r`` per second (a least-squares slope
  over the last 10 s of scrapes), that is ``(usage - release) / r + window``. When usage is not
  falling, the next long request's completion is the best guess: ``s + window``.
* With no observation yet, the fallback is derived from the configuration (two pressure windows),
  never a fixed constant.

Results are clamped to [1 s, 300 s] and rounded up to whole seconds, as the header requires.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MIN_RETRY_AFTER = 1.0
MAX_RETRY_AFTER = 300.0
SLOPE_WINDOW_SECONDS = 10.0
EWMA_WEIGHT = 0.2


def clamp_retry_after(seconds: float) -> int:
    """Whole seconds within [1, 300]."""
    if not math.isfinite(seconds):
        seconds = MAX_RETRY_AFTER
    return math.ceil(min(MAX_RETRY_AFTER, max(MIN_RETRY_AFTER, seconds)))


@dataclass(slots=True)
class ServiceStats:
    """Recent service times of one lane (admit -> response finished)."""

    mean_seconds: float | None = None

    def record(self, seconds: float) -> None:
        """One request of the lane finished after ``seconds``."""
        if self.mean_seconds is None:
            self.mean_seconds = seconds
        else:
            self.mean_seconds += EWMA_WEIGHT * (seconds - self.mean_seconds)


def queue_wait_estimate(position: int, concurrency: int, stats: ServiceStats, fallback: float) -> float:
    """Seconds until a request at ``position`` (0 = next) would start."""
    service = stats.mean_seconds if stats.mean_seconds is not None else fallback
    return (position + 1) * service / max(1, concurrency)


def capacity_wait_estimate(
    blocks_ahead: int, blocks_needed: int, free_blocks: int, release_rate: float | None
) -> float | None:
    """Seconds until enough blocks are released behind ``blocks_ahead``; ``None``: no rate seen yet."""
    missing = blocks_ahead + blocks_needed - max(0, free_blocks)
    if missing <= 0:
        return 0.0
    if not release_rate:
        return None
    return missing / release_rate


def usage_fall_rate(samples: Sequence[tuple[float, float]], now: float) -> float | None:
    """KV usage lost per second over the last 10 s (positive when falling), or ``None``."""
    recent = [(t, u) for t, u in samples if now - t <= SLOPE_WINDOW_SECONDS]
    if len(recent) < 2:
        return None
    mean_t = sum(t for t, _ in recent) / len(recent)
    mean_u = sum(u for _, u in recent) / len(recent)
    spread = sum((t - mean_t) ** 2 for t, _ in recent)
    if spread == 0:
        return None
    slope = sum((t - mean_t) * (u - mean_u) for t, u in recent) / spread
    return -slope if slope < 0 else None


def pressure_wait_estimate(
    usage: float | None,
    fall_rate: float | None,
    release_threshold: float,
    window: float,
    long_lane: ServiceStats,
) -> float:
    """Seconds until pressure is likely to end."""
    if usage is not None and fall_rate:
        return max(0.0, usage - release_threshold) / fall_rate + window
    if long_lane.mean_seconds is not None:
        return long_lane.mean_seconds + window
    return 2 * window
