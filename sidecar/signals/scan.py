r"""A Prometheus text-format scanner that reads only the families asked for.

Theory of operation
-------------------
A vLLM ``/metrics`` page is 40-60 KB per engine, of which the sidecar needs a dozen lines.
``prometheus_client``'s parser builds every family and takes ~10 ms per page, which would block
the event loop at a 50 ms scrape interval. :func:`scan` instead splits the page into lines
(on ``\\n`` only, a trailing ``\\r`` stripped: ``str.splitlines`` would also split inside label
values at U+0085 or U+2028), drops comments at once, and tests each remaining line against the
wanted names with one ``str.startswith(tuple)`` call (C speed); only lines that match are
parsed: the name, the label block (one compiled pattern when it has no escapes; otherwise a
pair-by-pair parser that understands ``\\\\``, ``\\"`` and ``\\n``), the value
(``NaN``, ``+Inf``, ``-Inf`` included) and an optional timestamp, which is ignored.

Samples repeated with the same name and labels (as in some captures) keep the last value.
Anything malformed on a wanted line raises :class:`MetricsParseError` with the line number;
lines of other families are never parsed, so damage there cannot fail the scan. It never
raises anything else, whatever the input (a property test checks this).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass

from sidecar.errors import KvSidecarError

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
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


_LABEL_PAIR = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,[ \t]*)?')
_UNESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    return (
        _UNESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)
        if "\\" in value
        else value
    )


_SIMPLE_BLOCK = re.compile(
    r'(?:[a-zA-Z_][a-zA-Z0-9_]*+="[^"\\]*+",)*+(?:[a-zA-Z_][a-zA-Z0-9_]*+="[^"\\]*+")?+,?'
)
_SIMPLE_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def _parse_labels(line: str, start: int, lineno: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse ``{a="b",...}`` from ``start`` (the ``{``); return the labels and the index after the ``}``.

    A compiled pattern consumes one ``name="value",`` pair at a time (C speed); where it stops
    short of the closing brace, :func:`_label_error` finds the precise fault for the message.
    """
    labels: list[tuple[str, str]] = []
    position = start + 1
    match = _LABEL_PAIR.match(line, position)
    while match is not None:
        labels.append((match.group(1), _unescape(match.group(2))))
        position = match.end()
        if match.group(3) is None:
            break
        match = _LABEL_PAIR.match(line, position)
    while position < len(line) and line[position] in " \t":
        position += 1
    if position < len(line) and line[position] == "}":
        return tuple(sorted(labels)), position + 1
    raise MetricsParseError(f"line {lineno}: {_label_error(line, position)}")


def _label_error(line: str, position: int) -> str:
    """Describe what is wrong with the label text at ``position``."""
    rest = line[position:]
    eq = rest.find("=")
    if eq < 0:
        return "label without '='" if rest.strip() else "unterminated label set"
    key = rest[:eq].strip()
    if not _LABEL_NAME.match(key):
        return f"invalid label name {key[:40]!r}"
    value = rest[eq + 1 :].lstrip(" \t")
    if not value.startswith('"'):
        return f"label {key!r} value is not quoted"
    body = value[1:]
    index = 0
    while index < len(body):
        if body[index] == "\\":
            if index + 1 >= len(body):
                return f"dangling escape in label {key!r}"
            index += 2
            continue
        if body[index] == '"':
            return f"expected ',' or '}}' after label {key!r}"
        index += 1
    return f"unterminated value of label {key!r}"


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
    for lineno, raw in enumerate(text.split("\n"), start=1):  # not splitlines(): U+0085 may sit in a label
        if not raw.startswith(wanted):
            continue
        line = raw.strip()
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            if name not in wanted_set:
                continue
            close = line.find("}", brace)
            block = line[brace + 1 : close]
            if close > 0 and "\\" not in block and _SIMPLE_BLOCK.fullmatch(block):  # the common case, in C
                labels, rest = tuple(sorted(_SIMPLE_PAIR.findall(block))), line[close + 1 :]
            else:
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
