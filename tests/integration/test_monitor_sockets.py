"""The monitor on real sockets against a fake vLLM that serves the recorded real pages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sidecar.budget import load_architecture
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.planning import PlanInputs
from sidecar.units import GIB
from tests.fake_vllm import FakeVllm, page, substitute
from tests.integration.conftest import INTERVAL, RunningSidecar, start_sidecar

pytestmark = pytest.mark.integration


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(INTERVAL / 2)


async def test_kv_usage_follows_the_page_within_one_interval(
    fake_vllm: FakeVllm, sidecar: RunningSidecar
) -> None:
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_kv_cache_usage_ratio", 1.0))
    fake_vllm.state.set_kv_usage(0.42)
    changed_at = time.monotonic()
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_kv_cache_usage_ratio", 0.42))
    # one scrape interval, plus one round trip of the test's own polling
    assert time.monotonic() - changed_at < INTERVAL * 2 + 0.1


async def _equals(sidecar: RunningSidecar, name: str, value: float, **labels: str) -> bool:
    return await sidecar.metric(name, **labels) == value


async def _at_least(sidecar: RunningSidecar, name: str, value: float, **labels: str) -> bool:
    found = await sidecar.metric(name, **labels)
    return found is not None and found >= value  # failures go on while the test looks: never exactly one


async def test_budget_shows_the_engine_pool_next_to_the_prediction(
    fake_vllm: FakeVllm, tiny_model_dir: Path
) -> None:
    inputs = PlanInputs(
        architecture=load_architecture(tiny_model_dir), model="tiny", gpu_memory_bytes=24 * GIB
    )
    running = await start_sidecar(fake_vllm.url, inputs)
    try:
        await eventually(lambda: _equals(running, "kv_sidecar_engine_up", 1.0))
        budget = (await running.get("/budget")).json()
        assert budget["engine"]["kv_pool_tokens"] == 2048
        assert budget["engine"]["max_model_len"] == 1024
        assert budget["predicted"]["kv_pool_tokens"] == 2048
        assert budget["comparison"]["pool_drift_ratio"] == 0.0
        assert await running.metric("kv_sidecar_kv_pool_tokens", source="engine") == 2048
        assert await running.metric("kv_sidecar_kv_pool_tokens", source="predicted") == 2048
    finally:
        await running.app.stop()


async def test_engine_down_at_start_then_up() -> None:
    fake = FakeVllm()
    await fake.start()
    port = fake.port
    await fake.stop()  # the port is now closed: the engine is "down at start"
    running = await start_sidecar(f"http://127.0.0.1:{port}")
    try:
        await eventually(lambda: _equals(running, "kv_sidecar_scrape_errors_total", 1.0, reason="connect"))
        assert await running.metric("kv_sidecar_engine_up") == 0.0
        assert (await running.get("/healthz")).status_code == 200
        restarted = FakeVllm(port=port)
        await restarted.start()
        try:
            await eventually(lambda: _equals(running, "kv_sidecar_engine_up", 1.0))
        finally:
            await restarted.stop()
    finally:
        await running.app.stop()


async def test_stopping_the_upstream_is_one_log_line_and_a_growing_age(
    fake_vllm: FakeVllm, sidecar: RunningSidecar
) -> None:
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_up", 1.0))
    await fake_vllm.stop()
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_up", 0.0))
    first_age = await sidecar.metric("kv_sidecar_engine_metrics_age_seconds")
    await asyncio.sleep(0.6)  # several scrape attempts (with backoff)
    second_age = await sidecar.metric("kv_sidecar_engine_metrics_age_seconds")
    assert first_age is not None
    assert second_age is not None
    assert second_age > first_age + 0.4
    assert [e["event"] for e in sidecar.logs()].count("engine_down") == 1
    assert (await sidecar.get("/healthz")).status_code == 200
    assert (await sidecar.get("/readyz")).status_code == 200  # stale policy open: traffic still flows
    status = (await sidecar.get("/status")).json()
    assert status["engine"]["up"] is False
    assert status["engine"]["metrics_age_seconds"] >= second_age
    errors = await sidecar.metric("kv_sidecar_scrape_errors_total", reason="connect")
    assert errors is not None
    assert errors >= 2


async def test_closed_stale_policy_makes_readyz_fail(fake_vllm: FakeVllm) -> None:
    running = await start_sidecar(fake_vllm.url, stale_policy="closed")
    try:
        await eventually(lambda: _status(running, "/readyz", 200))
        await fake_vllm.stop()
        await eventually(lambda: _status(running, "/readyz", 503))
    finally:
        await running.app.stop()


async def test_an_upstream_that_is_no_engine_is_not_ready(
    fake_vllm: FakeVllm, sidecar: RunningSidecar
) -> None:
    await eventually(lambda: _status(sidecar, "/readyz", 200))
    fake_vllm.state.metrics_page = "# a Prometheus page, but not vLLM's\nprocess_cpu_seconds_total 12.5\n"
    await eventually(lambda: _status(sidecar, "/readyz", 503))
    assert (await sidecar.get("/readyz")).json() == {"ready": False, "reason": "upstream-not-an-engine"}


async def _status(sidecar: RunningSidecar, path: str, code: int) -> bool:
    return (await sidecar.get(path)).status_code == code


async def test_slow_engine_times_out(fake_vllm: FakeVllm) -> None:
    fake_vllm.state.metrics_delay = 1.0
    running = await start_sidecar(fake_vllm.url, scrape_timeout=0.1)
    try:
        await eventually(lambda: _equals(running, "kv_sidecar_scrape_errors_total", 1.0, reason="timeout"))
        assert await running.metric("kv_sidecar_engine_up") == 0.0
        started = time.monotonic()
        assert (await running.get("/status")).status_code == 200
        assert time.monotonic() - started < 0.5  # the admin port never waits on the engine
    finally:
        await running.app.stop()


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (500, "Internal Server Error", "status"),
        (200, 'vllm:kv_cache_usage_perc{engine="0" 1\n', "parse"),
        (200, 'vllm:num_requests_running{engine="0"} \x00\x01\n', "parse"),
    ],
)
async def test_bad_answers_count_as_down(fake_vllm: FakeVllm, status: int, body: str, reason: str) -> None:
    fake_vllm.state.metrics_status = status
    fake_vllm.state.metrics_page = body
    running = await start_sidecar(fake_vllm.url)
    try:
        await eventually(lambda: _at_least(running, "kv_sidecar_scrape_errors_total", 1.0, reason=reason))
        assert await running.metric("kv_sidecar_engine_up") == 0.0
        assert (await running.get("/status")).json()["engine"]["last_error"]
    finally:
        await running.app.stop()


async def test_empty_and_truncated_pages(fake_vllm: FakeVllm, sidecar: RunningSidecar) -> None:
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_up", 1.0))
    fake_vllm.state.metrics_page = ""
    await eventually(
        lambda: _equals(sidecar, "kv_sidecar_diagnosis_active", 1.0, id="engine-metrics-missing")
    )
    text = page("vllm-0.32.0-cpu-tiny-kv-pressure.prom")
    fake_vllm.state.metrics_page = text[: text.index("vllm:kv_cache_usage_perc{") + 30]
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_up", 0.0))


async def test_renamed_metric_is_diagnosed_not_fatal(fake_vllm: FakeVllm, sidecar: RunningSidecar) -> None:
    fake_vllm.state.metrics_page = fake_vllm.state.metrics_page.replace(
        "vllm:kv_cache_usage_perc", "vllm:kv_used"
    )
    await eventually(
        lambda: _equals(sidecar, "kv_sidecar_diagnosis_active", 1.0, id="engine-metrics-missing")
    )
    assert await sidecar.metric("kv_sidecar_engine_up") == 1.0
    assert await sidecar.metric("kv_sidecar_engine_kv_cache_usage_ratio") is None
    assert await sidecar.metric("kv_sidecar_engine_requests", state="running") == 3.0


async def test_old_metric_name_still_works(fake_vllm: FakeVllm, sidecar: RunningSidecar) -> None:
    renamed = fake_vllm.state.metrics_page.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    fake_vllm.state.metrics_page = substitute(renamed, "vllm:gpu_cache_usage_perc", 0.77)
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_kv_cache_usage_ratio", 0.77))


async def test_several_engines_aggregate(fake_vllm: FakeVllm, sidecar: RunningSidecar) -> None:
    from tests.unit.test_vllm_signals import _two_engines  # noqa: PLC0415

    fake_vllm.state.metrics_page = _two_engines()
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_kv_cache_usage_ratio", 0.9))
    assert await sidecar.metric("kv_sidecar_engine_requests", state="running") == 5.0
    assert (await sidecar.get("/status")).json()["engine"]["engines"] == ["0", "1"]


async def test_sustained_pressure_is_diagnosed(fake_vllm: FakeVllm) -> None:
    running = await start_sidecar(fake_vllm.url, settings=MonitorSettings(sustain_seconds=0.3))
    try:
        await eventually(
            lambda: _equals(running, "kv_sidecar_diagnosis_active", 1.0, id="kv-usage-high-sustained")
        )
        await eventually(
            lambda: _equals(running, "kv_sidecar_diagnosis_active", 1.0, id="requests-waiting-sustained")
        )
        fake_vllm.state.set_kv_usage(0.2)
        await eventually(
            lambda: _equals(running, "kv_sidecar_diagnosis_active", 0.0, id="kv-usage-high-sustained")
        )
        events = [e for e in running.logs() if e["event"] in {"diagnosis", "diagnosis_cleared"}]
        high = [e for e in events if e.get("id") == "kv-usage-high-sustained"]
        assert [e["event"] for e in high] == ["diagnosis", "diagnosis_cleared"]  # one line per change
    finally:
        await running.app.stop()


async def test_a_scraper_that_dies_is_restarted_and_counted(
    fake_vllm: FakeVllm, sidecar: RunningSidecar
) -> None:
    """A bug inside one round (here: the round's hook raising) kills the loop; it is started again."""
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_up", 1.0))
    scraper = sidecar.app._scraper  # noqa: SLF001 - the loop under test
    assert scraper is not None
    hook = scraper._on_round  # noqa: SLF001
    failures = [2]

    def broken_round() -> None:
        if failures[0] > 0:
            failures[0] -= 1
            raise RuntimeError("a bug in a round")
        if hook is not None:
            hook()

    scraper._on_round = broken_round  # noqa: SLF001
    await eventually(lambda: _equals(sidecar, "kv_sidecar_scraper_restarts_total", 2.0))
    fake_vllm.state.set_kv_usage(0.37)  # and it keeps watching the engine
    await eventually(lambda: _equals(sidecar, "kv_sidecar_engine_kv_cache_usage_ratio", 0.37))
    restarts = [line for line in sidecar.logs() if line["event"] == "scraper_restarted"]
    assert [line["error"] for line in restarts] == ["RuntimeError: a bug in a round"] * 2
