"""A labelled metric's children, each looked up once.

``prometheus_client``'s ``labels()`` validates the values and takes the metric's lock on every call; on the
proxy's hot path (a few per request) that is measurable (``bench/proxy_overhead.py``, py-spy: about 2% of the
sidecar's CPU at 8 connections), so the children are kept by their label values.
"""

from __future__ import annotations

from typing import Generic, Protocol, Self, TypeVar


class _Labelled(Protocol):
    def labels(self, *values: str) -> Self: ...


M = TypeVar("M", bound=_Labelled)


class Children(Generic[M]):
    """``children(*values)`` is ``metric.labels(*values)``, looked up once per tuple of values."""

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        """The child for these label values (in the metric's label order)."""
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child
