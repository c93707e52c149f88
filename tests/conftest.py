"""Project-wide pytest configuration.

When ``CI`` is set, a skipped test counts as a failure: a missing real part (vLLM, Prometheus,
Helm rendering) must not hide behind a skip.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

_IN_CI = os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if _IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which counts as a failure: {reason}"
