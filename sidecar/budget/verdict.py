"""The plan's verdict: whether a deployment fits its GPU, on paper and in vLLM's pool."""

from __future__ import annotations

from enum import StrEnum
from typing import Final

TIGHT_HEADROOM_FRACTION: Final = 0.10
"""Headroom below this share of GPU memory makes a plan ``tight`` (the seeds' 5-10% real-world excess)."""


class Verdict(StrEnum):
    """Whether the target deployment fits the GPU."""

    FITS = "fits"
    TIGHT = "tight"
    DOES_NOT_FIT = "does-not-fit"


def plan_verdict(memory: int, total: int, max_concurrency: float, concurrency: int) -> Verdict:
    """The verdict for a ``total`` on a card of ``memory`` bytes and vLLM's ``max_concurrency``.

    ``does-not-fit`` over the card or below one full-length request in vLLM's pool; ``tight`` under 10%
    headroom or below the target ``concurrency``; else ``fits``.
    """
    if total > memory or max_concurrency < 1:
        return Verdict.DOES_NOT_FIT
    if memory - total < TIGHT_HEADROOM_FRACTION * memory or max_concurrency < concurrency:
        return Verdict.TIGHT
    return Verdict.FITS
