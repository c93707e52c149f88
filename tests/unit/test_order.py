"""The urgency order of waiting requests: shortest first where sizes differ, first come first served among equals."""

from __future__ import annotations

import pytest

from sidecar.admission.order import SIMILAR_SIZE, pick_next


def pick(waiting: list[tuple[str, int, float]]) -> str | None:
    """(name, expected tokens, seconds waited) -> the name that goes next."""
    chosen = pick_next(waiting, lambda w: w[1], lambda w: w[2])
    return None if chosen is None else chosen[0]


@pytest.mark.parametrize(
    ("waiting", "goes"),
    [
        ([], None),
        ([("mid", 600, 0.5), ("short", 40, 0.0)], "short"),  # 15x smaller: shortest first
        ([("mid", 600, 12.0), ("short", 40, 0.0)], "short"),  # aged to 86: still over 2x the short one
        ([("mid", 600, 14.0), ("short", 40, 0.0)], "short"),  # aged to 75: still not a short one's size
        ([("mid", 600, 30.0), ("short", 40, 0.0)], "mid"),  # aged to 37.5: more urgent than the short one
        ([("older", 270, 0.1), ("newer", 230, 0.0)], "older"),  # near-equals: first come, first served
        ([("a", 100, 1.0), ("b", 100, 1.0)], "a"),  # equals: the fair order breaks the tie
        ([("big", 1000, 3.0), ("small", 100, 0.1), ("smaller", 90, 0.0)], "small"),  # oldest of the similar
    ],
)
def test_who_goes_next(waiting: list[tuple[str, int, float]], goes: str | None) -> None:
    assert pick(waiting) == goes


def test_similar_means_within_a_factor_of_two() -> None:
    assert SIMILAR_SIZE == 2.0
    assert pick([("old", 201, 0.0001), ("new", 100, 0.0)]) == "new"  # just over 2x: the smaller goes
    assert pick([("old", 199, 0.0001), ("new", 100, 0.0)]) == "old"
