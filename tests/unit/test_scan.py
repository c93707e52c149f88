"""The Prometheus text scanner: table tests at the format's corners, and fuzzing."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.signals import MetricsParseError, scan


def one(text: str, name: str = "m"):  # type: ignore[no-untyped-def]
    samples = scan(text, [name])
    assert len(samples) == 1
    return samples[0]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("m 1", 1.0),
        ("m 1.5e3", 1500.0),
        ("m -2", -2.0),
        ("m +Inf", math.inf),
        ("m -Inf", -math.inf),
        ("m 1 1700000000000", 1.0),  # timestamp ignored
        ("m{} 3", 3.0),
        ("m   4  ", 4.0),
        ("m 5\r", 5.0),
    ],
)
def test_values(text: str, value: float) -> None:
    assert one(text).value == value


def test_nan() -> None:
    assert math.isnan(one("m NaN").value)


@pytest.mark.parametrize(
    ("text", "labels"),
    [
        ('m{a="b"} 1', {"a": "b"}),
        ('m{a="b",c="d"} 1', {"a": "b", "c": "d"}),
        ('m{a="b",} 1', {"a": "b"}),
        ('m{ a="b" , c="d" } 1', {"a": "b", "c": "d"}),
        (r'm{a="x\"y"} 1', {"a": 'x"y'}),
        (r'm{a="x\\y"} 1', {"a": "x\\y"}),
        (r'm{a="x\ny"} 1', {"a": "x\ny"}),
        ('m{a="x y}z"} 1', {"a": "x y}z"}),
        ('m{a=""} 1', {"a": ""}),
        ('m{a="中文"} 1', {"a": "中文"}),
    ],
)
def test_labels(text: str, labels: dict[str, str]) -> None:
    assert dict(one(text).labels) == labels


def test_crlf_page_and_comments() -> None:
    page = '# HELP m help\r\n# TYPE m gauge\r\nm{a="1"} 1\r\nm{a="2"} 2\r\n'
    assert [s.value for s in scan(page, ["m"])] == [1.0, 2.0]


def test_repeated_samples_keep_the_last_value() -> None:
    page = 'm{a="1"} 1\nm{a="1"} 7\nm{a="2"} 2\n'
    assert {s.label("a"): s.value for s in scan(page, ["m"])} == {"1": 7.0, "2": 2.0}


def test_prefix_collisions_are_not_matches() -> None:
    page = (
        'vllm:num_requests_waiting 1\nvllm:num_requests_waiting_by_reason{reason="x"} 5\n'
        "m_total 3\nm_created 9\n"
    )
    assert [s.name for s in scan(page, ["vllm:num_requests_waiting"])] == ["vllm:num_requests_waiting"]
    assert [s.value for s in scan(page, ["m_total"])] == [3.0]


def test_absent_families_give_nothing() -> None:
    assert scan("other 1\n", ["m"]) == []
    assert scan("", ["m"]) == []


def test_damage_in_unwanted_lines_is_ignored() -> None:
    assert one('garbage{{{ "\nm 1\nother{a="unterminated 1\n').value == 1.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m", "without a value"),
        ("m abc", "not a number"),
        ("m nan(1)", "not a number"),
        ("m 1 2 3", "value and an optional timestamp"),
        ('m{a="b} 1', "unterminated"),
        ("m{a=b} 1", "not quoted"),
        ('m{1a="b"} 1', "invalid label name"),
        ('m{a="b" c="d"} 1', "expected ','"),
        ("m{a} 1", "without '='"),
        ('m{a="b\\', "dangling escape"),
        ('m{a="b"}', "value and an optional timestamp"),
    ],
)
def test_malformed_wanted_lines_raise_the_typed_error(text: str, message: str) -> None:
    with pytest.raises(MetricsParseError, match=message):
        scan(text, ["m"])


@settings(max_examples=500)
@given(st.text(max_size=300))
def test_fuzz_only_typed_errors(text: str) -> None:
    with contextlib.suppress(MetricsParseError):
        scan(text, ["m", "vllm:kv_cache_usage_perc"])


label_value = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@given(
    st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), label_value, max_size=4),
    st.floats(allow_nan=False),
)
def test_round_trip_of_generated_samples(labels: dict[str, str], value: float) -> None:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    sample = one(f"m{{{body}}} {value!r}\n")
    assert dict(sample.labels) == labels
    assert sample.value == value


@given(st.lists(st.sampled_from(["m 1", "# c", "x 2", 'm{a="1"} 3', "", "m_total 4"]), max_size=20))
def test_page_order_is_kept(lines: list[str]) -> None:
    samples = scan("\n".join(lines), ["m"])
    assert len(samples) == len({ln for ln in lines if ln.startswith("m ") or ln.startswith("m{")})
