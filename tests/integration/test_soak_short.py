"""A short soak in CI (the 10-minute one is ``bench/soak.py``): bounded memory and FDs, nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.integration


def test_short_soak_with_pressure_cycles(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--seconds",
            "45",  # the first 20 s are warm-up (bench/soak.py WARMUP_SECONDS); 25 s of load are measured
            "--cycle",
            "4",
            "--workers",
            "12",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(out.read_text())
    assert result.returncode == 0, result.stdout + result.stderr
    assert report["passed"] is True
    assert report["lost"] == 0
    assert report["client_failures"] == 0, report[
        "failure_examples"
    ]  # what the clients saw, not only counters
    assert report["requests"]["refused_with_retry_after"] + report["requests"]["short"] > 0
    assert report["requests"]["sent"] > 100
    assert report["rss_growth"] < 0.10
    assert report["sidecar_exit"] == 0
