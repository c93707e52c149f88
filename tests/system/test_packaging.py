"""The image recipe and the wheel it installs (no Docker engine here: the wheel is built and inspected)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.system


def test_dockerfile_is_slim_non_root_and_runs_the_cli() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) == 2
    assert all("python:3.11-slim" in s for s in stages)
    final = text.split(stages[1], 1)[1]
    assert "USER 10001:10001" in final
    assert 'ENTRYPOINT ["kv-sidecar"]' in final
    for tool in ("gcc", "build-essential", "apt-get install"):
        assert tool not in final
    assert "--no-index" in final  # the final stage installs only the wheels built before


def test_wheel_carries_the_catalog_and_type_marker(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "--wheel-dir",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("kv_sidecar-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    catalog = {n for n in names if n.startswith("sidecar/budget/models/") and n.endswith(".json")}
    assert len(catalog) == 17
    assert "sidecar/py.typed" in names
    tables = {f"sidecar/budget/{path.name}" for path in (ROOT / "sidecar" / "budget").glob("*.json")}
    assert tables <= names  # every table the planner reads at run time (renaming one must not drop it)
    assert "sidecar/budget/vllm_model_classes.json" in tables
    assert any(n.endswith("entry_points.txt") for n in names)
