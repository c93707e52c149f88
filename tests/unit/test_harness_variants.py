"""The A/B bench's variant syntax and the runs' mean-latency figure (harnesses in ``tests/harness``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.harness.admission_runs import Attempt, Client, summarize
from tests.harness.admission_shapes import SHAPES
from tests.harness.admission_suite import Variant, parse_variant
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
    clients = [
        Client("gen", False, Attempt(200, 1.0)),
        Client("gen", False, Attempt(429, 0.1, "kv-pressure", 1.0), Attempt(200, 3.0)),  # the retry decides
        Client("gen", True, Attempt(200, 9.0, error="stream ended without [DONE]")),
        Client("gen", False, Attempt(None, 9.0, error="TimeoutError")),
    ]
    shape = SHAPES["generous-max-tokens"]
    assert summarize(shape, clients, 0, 0.0, 1.0)["mean_latency"] == pytest.approx(2.0)
    assert summarize(shape, [], 0, 0.0, 1.0)["mean_latency"] is None
