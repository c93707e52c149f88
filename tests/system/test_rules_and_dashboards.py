"""The alert rules and dashboards, checked with promtool and against the project's own contracts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.generate import DASHBOARDS, expressions, render

ROOT = Path(__file__).parents[2]
RULES = ROOT / "alerts" / "kv-sidecar.rules.yaml"
TESTS = ROOT / "alerts" / "tests.yaml"
RUNBOOK = ROOT / "alerts" / "RUNBOOK.md"
pytestmark = pytest.mark.system

REQUIRED_ALERTS = {
    "KvSidecarKvCachePressureHigh",
    "KvSidecarKvCacheSaturated",
    "KvSidecarPreemptions",
    "KvSidecarRefusingRequests",
    "KvSidecarQueueWaitHigh",
    "KvSidecarMaxConcurrencyBelowTarget",
    "KvSidecarKvPoolDrift",
    "KvSidecarKvDtypeNotInEffect",
    "KvSidecarEngineDown",
    "KvSidecarEngineMetricsStale",
    "KvSidecarGpuMemoryAboveReservation",
    "KvSidecarGpuMemoryCreeping",
}
VARIABLES = {"$namespace": "test", "$pod": "kv-0", "$model": ".*", "$__rate_interval": "1m"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, check=False)


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def substitute(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def dashboard_documents() -> dict[str, dict[str, Any]]:
    return {name: json.loads((ROOT / "dashboards" / name).read_text()) for name in DASHBOARDS}


def test_promtool_checks_the_rule_file() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {r["alert"] for r in rules()}
    assert names >= REQUIRED_ALERTS
    assert firing == names
    assert quiet == names


def test_every_alert_is_documented_and_labelled() -> None:
    anchors = {h.lower() for h in re.findall(r"^## (\w+)$", RUNBOOK.read_text(), re.MULTILINE)}
    for rule in rules():
        assert rule["alert"].startswith("KvSidecar")
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), rule["alert"]
        path, anchor = annotations["runbook_url"].split("#")
        assert path == "alerts/RUNBOOK.md"
        assert anchor == rule["alert"].lower()
        assert anchor in anchors, f"RUNBOOK.md has no section for {rule['alert']}"


def test_committed_dashboards_are_what_the_code_generates() -> None:
    for name, factory in DASHBOARDS.items():
        assert (ROOT / "dashboards" / name).read_text() == render(factory), (
            f"run: python -m dashboards.generate ({name})"
        )
    result = subprocess.run(
        [sys.executable, "-m", "dashboards.generate", "--check"], cwd=ROOT, capture_output=True, check=False
    )
    assert result.returncode == 0


def test_dashboard_conventions() -> None:
    uids = set()
    for name, document in dashboard_documents().items():
        uids.add(document["uid"])
        variables = {v["name"]: v for v in document["templating"]["list"]}
        assert set(variables) == {"datasource", "namespace", "pod", "model"}, name
        assert variables["datasource"]["query"] == "prometheus"
        for item in document["panels"]:
            if item["type"] == "row":
                continue
            assert item["fieldConfig"]["defaults"].get("unit"), f"{name}: panel {item['title']} has no unit"
            assert item["datasource"]["uid"] == "${datasource}"
            assert item["targets"], item["title"]
            assert item.get("description"), item["title"]
            assert item["options"]["legend"]["showLegend"] is True
    assert uids == {"kv-sidecar-kv-pressure", "kv-sidecar-memory-budget"}


def test_every_expression_is_valid_promql(tmp_path: Path) -> None:
    exprs = [substitute(e) for doc in dashboard_documents().values() for e in expressions(doc)]
    exprs += [substitute(v["query"]).removeprefix("label_values(").rsplit(",", 1)[0]
              for doc in dashboard_documents().values() for v in doc["templating"]["list"] if v["type"] == "query"]  # fmt: skip
    assert len(exprs) > 20
    records = [{"record": f"kv_sidecar_check_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": records}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def _metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\b(kv_sidecar_[a-z0-9_]+|vllm:[a-z0-9_:]+)", expr))
    return {re.sub(r"_(bucket|count|sum)$", "", n) for n in names}


def test_queries_use_only_documented_sidecar_metrics_and_current_vllm_names() -> None:
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| `(kv_sidecar_[a-z0-9_]+)` \|", readme, re.MULTILINE))
    vllm_page = (ROOT / "tests/data/vllm/vllm-0.32.0-cpu-tiny-kv-pressure.prom").read_text()
    vllm_names = {
        re.sub(r"_(bucket|count|sum)$", "", n)
        for n in re.findall(r"^(vllm:[a-z0-9_:]+)", vllm_page, re.MULTILINE)
    }
    used: set[str] = set()
    for doc in dashboard_documents().values():
        for expr in expressions(doc) + [v.get("query", "") for v in doc["templating"]["list"]]:
            used |= _metric_names(str(expr))
    for rule in rules():
        used |= _metric_names(rule["expr"])
    unknown = {n for n in used if n.startswith("kv_sidecar_") and n not in documented}
    assert not unknown, f"undocumented sidecar metrics: {unknown}"
    stale = {n for n in used if n.startswith("vllm:") and n not in vllm_names}
    assert not stale, f"vLLM names that current vLLM does not export: {stale}"
    assert "vllm:num_preemptions" not in used  # the name public dashboards get wrong
