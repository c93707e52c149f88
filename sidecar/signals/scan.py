r"""A Prometheus text-format scanner that reads only the families asked for.

Theory of operation
-------------------
A vLLM ``/metrics`` page is 40-60 KB per engine, of which the sidecar needs a dozen lines.
``prometheus_client``'s parser builds every family and takes ~10 ms per page, which would block
the event loop at a 50 ms scrape interval. :func:`scan` instead splits the page into lines
(``\\n`` or ``\\r\\n``), drops comments at once, and tests each remaining line against the
wanted names with one ``str.startswith(tuple)`` call (C speed); only lines that match are
parsed: the name, the label block (with ``\\\\``, ``\\"`` and ``\\n`` escapes), the value
(``NaN``, ``+Inf``, ``-Inf`` included) and an optional timestamp, which is ignored.

Samples repeated with the same name and labels (as in some captures) keep the last value.
Anything malformed on a wanted line raises :class:`MetricsParseError` with the line number;
lines of other families are never parsed, so damage there cannot fail the scan. It never
raises anything else, whatever the input (a property test checks this).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from sidecar.errors import KvSidecarError

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class MetricsParseError(KvSidecarError):
    """A wanted line of a metrics page is malformed."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample: metric name, labels (sorted pairs) and value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str, default: str = "") -> str:
        """The value of label ``key``, or ``default``."""
        for name, value in self.labels:
            if name == key:
                return value
        return default


def _parse_labels(  # noqa: PLR0912 - a flat character loop is the fast way in CPython
    line: str, start: int, lineno: int
) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse ``{a="b",...}`` from ``start`` (the ``{``); return the labels and the index after the ``}``."""
    labels: list[tuple[str, str]] = []
    i = start + 1
    length = len(line)
    while True:
        while i < length and line[i] in " \t":
            i += 1
        if i < length and line[i] == "}":
            return tuple(sorted(labels)), i + 1
        eq = line.find("=", i)
        if eq < 0:
            raise MetricsParseError(f"line {lineno}: label without '='")
        key = line[i:eq].strip()
        if not key or not (key[0].isalpha() or key[0] == "_") or not key.replace("_", "").isalnum():
            raise MetricsParseError(f"line {lineno}: invalid label name {key[:40]!r}")
        i = eq + 1
        if i >= length or line[i] != '"':
            raise MetricsParseError(f"line {lineno}: label {key!r} value is not quoted")
        i += 1
        chars: list[str] = []
        while True:
            if i >= length:
                raise MetricsParseError(f"line {lineno}: unterminated value of label {key!r}")
            char = line[i]
            if char == "\\":
                if i + 1 >= length:
                    raise MetricsParseError(f"line {lineno}: dangling escape in label {key!r}")
                chars.append(_ESCAPES.get(line[i + 1], "\\" + line[i + 1]))
                i += 2
                continue
            if char == '"':
                i += 1
                break
            chars.append(char)
            i += 1
        labels.append((key, "".join(chars)))
        while i < length and line[i] in " \t":
            i += 1
        if i < length and line[i] == ",":
            i += 1
        elif i < length and line[i] == "}":
            continue
        else:
            raise MetricsParseError(f"line {lineno}: expected ',' or '}}' after label {key!r}")


def _parse_value(text: str, lineno: int) -> float:
    parts = text.split()
    if not parts or len(parts) > 2:
        raise MetricsParseError(f"line {lineno}: expected a value and an optional timestamp")
    try:
        value = float(parts[0])
    except ValueError:
        raise MetricsParseError(f"line {lineno}: {parts[0][:40]!r} is not a number") from None
    if math.isnan(value) and parts[0].lower() != "nan":  # float() also accepts "nan(...)" spellings
        raise MetricsParseError(f"line {lineno}: {parts[0][:40]!r} is not a number")
    return value


def scan(text: str, names: Collection[str]) -> list[Sample]:
    """The samples of the metric ``names`` on a Prometheus text page, in page order (last repeat wins)."""
    wanted = tuple(names)
    wanted_set = frozenset(names)
    found: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.startswith(wanted):
            continue
        line = raw.strip()
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            if name not in wanted_set:
                continue
            labels, end = _parse_labels(line, brace, lineno)
            rest = line[end:]
        else:
            if space < 0:
                raise MetricsParseError(f"line {lineno}: sample without a value")
            name = line[:space]
            if name not in wanted_set:
                continue
            labels, rest = (), line[space:]
        found[(name, labels)] = Sample(name, labels, _parse_value(rest, lineno))
    return list(found.values())
