"""Facts written once: module sizes, metric family names, diagnosis ids and refusal reasons documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.admission.outcomes import Reason
from sidecar.monitor.diagnose import DiagnosisId

ROOT = Path(__file__).parents[2]
SOURCES = sorted((ROOT / "sidecar").rglob("*.py"))
README = (ROOT / "README.md").read_text(encoding="utf-8")
MAX_MODULE_LINES = 400


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(ROOT)) for p in SOURCES])
def test_no_module_is_over_400_lines(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_MODULE_LINES


TELEMETRY = ROOT / "sidecar" / "server" / "metrics.py"


def test_every_metric_family_is_defined_once_in_one_module() -> None:
    names: list[str] = []
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        found = re.findall(r'"(kv_sidecar_[a-z_]+)"', text)
        found += ["kv_sidecar_" + n for n in re.findall(r'_gauge\(\s*"([a-z_]+)"', text)]
        assert path == TELEMETRY or not found, f"{path.relative_to(ROOT)} defines {found}"
        names += found
    assert len(names) > 20
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert repeated == []


def test_the_pure_core_imports_no_metrics_library() -> None:
    """Admission, signals, budget and the monitor's core record through protocols, not prometheus_client."""
    modules = [
        "sidecar.admission.controller",
        "sidecar.admission.capacity",
        "sidecar.signals",
        "sidecar.budget",
    ]
    code = f"import sys; import {', '.join(modules)}; print('prometheus_client' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("diagnosis", list(DiagnosisId))
def test_every_diagnosis_has_a_documented_row(diagnosis: DiagnosisId) -> None:
    assert f"| `{diagnosis.value}` |" in README


REFUSALS = [r for r in Reason if r not in {Reason.ADMITTED, Reason.QUEUED, Reason.CLIENT_DISCONNECTED}]


@pytest.mark.parametrize("reason", REFUSALS)
def test_every_refusal_has_a_status_a_type_and_a_documented_row(reason: Reason) -> None:
    assert 400 <= reason.status < 600
    assert reason.error_type
    assert re.search(rf"^\| {reason.status} \| `{re.escape(reason.value)}` \|", README, re.MULTILINE)


def test_tests_never_import_the_benchmarks() -> None:
    """The shared harnesses live in ``tests/harness``; ``bench/`` may import them, never the other way."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if re.search(r"^\s*(from bench[. ]|import bench\b)", path.read_text(encoding="utf-8"), re.MULTILINE)
    ]
    assert offenders == []
