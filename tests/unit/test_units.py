from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.errors import UsageError
from sidecar.units import (
    GIB,
    MIB,
    parse_duration,
    parse_positive_int,
    parse_ratio,
    parse_size,
    parse_upstream,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * GIB),
        ("24 GiB", 24 * GIB),
        ("80GB", 80 * 10**9),
        ("512MiB", 512 * MIB),
        ("1073741824", GIB),
        ("1.5GiB", 3 * GIB // 2),
        ("24gi", 24 * GIB),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["abc", "", "-1GiB", "0", "12XB", "GiB", "1e999"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(UsageError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"), [("500ms", 0.5), ("5s", 5.0), ("2m", 120.0), ("0.5", 0.5), ("5", 5)]
)
def test_durations(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["soon", "5d", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(UsageError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "ok"), [("0.85", True), ("1", True), ("0", False), ("1.01", False), ("x", False)]
)
def test_ratios(text: str, ok: bool) -> None:
    if ok:
        assert parse_ratio(text) == float(text)
    else:
        with pytest.raises(UsageError):
            parse_ratio(text)


@pytest.mark.parametrize(
    ("text", "expected"), [("4", 4), ("32768", 32768), ("32k", 32768), ("32_768", 32768)]
)
def test_positive_ints(text: str, expected: int) -> None:
    assert parse_positive_int(text) == expected


@pytest.mark.parametrize("text", ["0", "-5", "four", "1.5"])
def test_bad_positive_ints(text: str) -> None:
    with pytest.raises(UsageError, match="invalid number"):
        parse_positive_int(text)


@given(st.text(max_size=30))
def test_parsers_raise_only_usage_errors(text: str) -> None:
    for parse in (parse_size, parse_duration, parse_ratio, parse_positive_int):
        with contextlib.suppress(UsageError):
            parse(text)


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://vllm:8000/", "http://vllm:8000"),
        ("https://gw.example/prefix/", "https://gw.example/prefix"),
    ],
)
def test_upstream_urls(text: str, url: str) -> None:
    assert parse_upstream(text) == url


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("127.0.0.1:8000", "give vLLM's URL with its scheme"),
        ("ftp://vllm:8000", "give vLLM's URL with its scheme"),
        ("http://vllm:8000/v1", "the OpenAI base URL: give vLLM's root, http://vllm:8000 "),
        ("http://vllm:8000/v1/", "the OpenAI base URL: give vLLM's root, http://vllm:8000 "),
        ("http://vllm:8000?x=1", "no query or fragment"),
    ],
)
def test_upstream_urls_refused(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_upstream(text)
