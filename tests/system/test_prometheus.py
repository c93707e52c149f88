"""A real Prometheus scrapes a running sidecar (in front of a fake vLLM steered into pressure) and vLLM's page:
every dashboard panel's query returns data, and the KV pressure alert becomes pending or firing."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import yaml

from dashboards.generate import DASHBOARDS
from sidecar.admission.pressure import PressureSettings
from sidecar.app import RunOptions, SidecarApp
from sidecar.budget import architecture_from_config
from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.scraper import ScrapeSettings
from sidecar.units import GIB
from tests.fake_vllm import TINY_CONFIG, FakeVllm
from tests.harness.vllm import free_port
from tests.system.test_rules_and_dashboards import RULES, substitute
from tests.unit.test_nvml_and_metrics import FakeNvml

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.system


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """Fake vLLM under pressure, the sidecar (proxy on, fake NVML), and Prometheus scraping both."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed: run scripts/ensure-prometheus")
    fake = FakeVllm()
    await fake.start()
    fake.state.set_kv_usage(0.95)
    app = SidecarApp(
        RunOptions(
            upstream=fake.url,
            admin_listen=("127.0.0.1", 0),
            listen=("127.0.0.1", 0),
            scrape=ScrapeSettings(interval=0.2),
            pressure=PressureSettings(window=1.0),
        ),
        PlanInputs(
            architecture=architecture_from_config(TINY_CONFIG), model="tiny", gpu_memory_bytes=24 * GIB
        ),
        MonitorSettings(sustain_seconds=2.0),
        make_logger(io.StringIO()),
        nvml_module=FakeNvml(),
    )
    await app.start()
    port = free_port()
    labels = {"namespace": "test", "pod": "kv-0"}
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "kv-sidecar",
                "static_configs": [{"targets": [f"127.0.0.1:{app.admin_port}"], "labels": labels}],
            },
            {
                "job_name": "vllm",
                "static_configs": [{"targets": [f"127.0.0.1:{fake.port}"], "labels": labels}],
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(  # noqa: ASYNC220 - starting a server process does not wait on it
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield {
            "prometheus": f"http://127.0.0.1:{port}",
            "app": app,
            "fake": fake,
            "log": tmp_path / "prometheus.log",
        }
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        await app.stop()
        await fake.stop()


async def _query(client: httpx.AsyncClient, base: str, expr: str) -> list[dict[str, Any]]:
    response = await client.get(base + "/api/v1/query", params={"query": expr})
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def _traffic(proxy: str) -> None:
    """A short request, and a long one that waits a second in the queue (pressure) and is dropped."""
    async with aiohttp.ClientSession() as session:
        for prompt in ([1, 2, 3], list(range(600)), "hello there"):
            async with session.post(
                proxy + "/v1/completions",
                json={"prompt": prompt, "max_tokens": 4},
                headers={"X-KV-Sidecar-Queue-Timeout": "1s"},
            ) as response:
                await response.read()


async def test_panels_return_data_and_the_pressure_alert_goes_pending(stack: dict[str, Any]) -> None:
    base = stack["prometheus"]
    app: SidecarApp = stack["app"]
    async with httpx.AsyncClient(timeout=5) as client:
        deadline = time.monotonic() + 60
        while True:  # Prometheus up, both targets scraped a few times
            try:
                up = await _query(client, base, "count_over_time(up[1m])")
                if len(up) == 2 and all(float(s["value"][1]) >= 5 for s in up):
                    break
            except (httpx.HTTPError, json.JSONDecodeError, AssertionError):
                pass
            assert time.monotonic() < deadline, stack["log"].read_text()[-3000:]
            await asyncio.sleep(0.5)
        await _traffic(f"http://127.0.0.1:{app.proxy_port}")
        await asyncio.sleep(3)

        empty = []
        checked = 0
        for name in DASHBOARDS:
            document = json.loads((ROOT / "dashboards" / name).read_text())
            for item in document["panels"]:
                for target in item.get("targets") or []:
                    expr = substitute(target["expr"])
                    checked += 1
                    if not await _query(client, base, expr):
                        empty.append(f"{name} / {item['title']}: {expr}")
        assert checked > 20
        assert not empty, "panels without data:\n" + "\n".join(empty)

        deadline = time.monotonic() + 30
        state = None
        while time.monotonic() < deadline:
            alerts = (await client.get(base + "/api/v1/alerts")).json()["data"]["alerts"]
            mine = [a for a in alerts if a["labels"]["alertname"] == "KvSidecarKvCachePressureHigh"]
            if mine:
                state = mine[0]["state"]
                assert mine[0]["labels"] == {
                    "alertname": "KvSidecarKvCachePressureHigh", "namespace": "test", "pod": "kv-0", "severity": "warning",
                }  # fmt: skip
                break
            await asyncio.sleep(0.5)
        assert state in {"pending", "firing"}
        assert not [a for a in alerts if a["labels"]["alertname"] == "KvSidecarEngineDown"]
