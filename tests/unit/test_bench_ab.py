"""The A/B bench's variant syntax and its mean-latency figure."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.admission_ab import Variant, mean_latency, parse_variant
from tests.harness.vllm import ROOT


def test_a_variant_runs_from_this_checkout_or_from_the_tree_it_names(tmp_path: Path) -> None:
    assert parse_variant("q50=--output-quantile=0.5,--log-level=info") == (
        "q50",
        Variant(["--output-quantile=0.5", "--log-level=info"], ROOT),
    )
    assert parse_variant("default=") == ("default", Variant([], ROOT))
    (tmp_path / "sidecar").mkdir()
    assert parse_variant(f"old@{tmp_path}=") == ("old", Variant([], tmp_path.resolve()))


@pytest.mark.parametrize("text", ["straight=", "bare=--x", "=--x", "old@/nonexistent-tree="])
def test_a_variant_that_cannot_be_told_apart_or_run_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_variant(text)


def test_the_mean_latency_counts_completed_final_attempts_only() -> None:
    def attempt(status: int | None, latency: float, error: str | None = None) -> dict[str, object]:
        return {"status": status, "latency": latency, "error": error}

    clients = [
        {"first": attempt(200, 1.0), "retry": None},
        {"first": attempt(429, 0.1), "retry": attempt(200, 3.0)},  # the retry decides
        {"first": attempt(200, 9.0, "stream ended without [DONE]"), "retry": None},
        {"first": attempt(None, 9.0, "TimeoutError"), "retry": None},
    ]
    assert mean_latency({"clients": clients}) == pytest.approx(2.0)
    assert mean_latency({"clients": []}) is None
