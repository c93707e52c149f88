"""The gateway view on the proxy port: the engine's page plus the sidecar-adjusted load series."""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.admission.decide import AdmissionConfig, AdmissionMode
from sidecar.admission.pressure import PressureSettings
from sidecar.server.gateway import KV_USAGE, QUEUED, RUNNING
from tests.fake_vllm import FakeVllm
from tests.integration.conftest import INTERVAL, RunningSidecar, start_sidecar

pytestmark = pytest.mark.integration

LONG = list(range(600))  # a long-lane request of the fake's max_model_len 1024


@pytest.fixture
async def gateway_sidecar(fake_vllm: FakeVllm) -> AsyncIterator[RunningSidecar]:
    """A proxying sidecar whose long lane takes one request at a time (so the rest queue)."""
    fake_vllm.state.set_kv_usage(0.1)
    running = await start_sidecar(
        fake_vllm.url,
        proxy=True,
        pressure=PressureSettings(window=0.2),
        admission=AdmissionConfig(mode=AdmissionMode.LANES),
    )
    yield running
    await running.app.stop()


async def proxy_series(sidecar: RunningSidecar) -> dict[str, float]:
    """The unlabelled samples of the proxy port's /metrics, by name."""
    async with aiohttp.ClientSession() as session, session.get(sidecar.proxy + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.labels:
                values[sample.name] = sample.value
    return values


async def test_the_proxy_port_serves_the_engine_page_and_the_gateway_series(
    fake_vllm: FakeVllm, gateway_sidecar: RunningSidecar
) -> None:
    await asyncio.sleep(3 * INTERVAL)
    async with (
        aiohttp.ClientSession() as session,
        session.get(gateway_sidecar.proxy + "/metrics") as response,
    ):
        text = await response.text()
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "vllm:kv_cache_usage_perc" in text  # the engine's families, for what else the gateway reads
    names = {family.name for family in text_string_to_metric_families(text)}  # the whole page parses
    assert {QUEUED, RUNNING, KV_USAGE} <= names
    before, started = fake_vllm.state.metrics_requests, time.monotonic()
    for _ in range(50):
        await proxy_series(gateway_sidecar)
    scraper_rounds = (time.monotonic() - started) / INTERVAL + 2
    assert fake_vllm.state.metrics_requests - before <= scraper_rounds  # served from memory, not forwarded


async def test_the_adjusted_queue_follows_the_sidecar_queue_within_half_a_second(
    fake_vllm: FakeVllm, gateway_sidecar: RunningSidecar
) -> None:
    fake_vllm.state.response_delay = 0.6  # each long request holds the long lane a while
    await asyncio.sleep(3 * INTERVAL)
    baseline = (await proxy_series(gateway_sidecar))[QUEUED]
    async with aiohttp.ClientSession() as session:
        body = {"model": "tiny", "prompt": LONG, "max_tokens": 8}
        sent = time.monotonic()
        tasks = [asyncio.create_task(session.post(gateway_sidecar.proxy + "/v1/completions", json=body))]
        await asyncio.sleep(0.05)
        tasks += [
            asyncio.create_task(session.post(gateway_sidecar.proxy + "/v1/completions", json=body))
            for _ in range(4)
        ]
        seen = None
        while time.monotonic() - sent < 1.5:
            series = await proxy_series(gateway_sidecar)
            if series[QUEUED] >= baseline + 4:
                seen = time.monotonic() - sent
                assert series[RUNNING] >= 0
                break
            await asyncio.sleep(0.01)
        assert seen is not None, "the gateway never saw the queue"
        assert seen < 0.5, f"the gateway saw the queue after {seen:.3f}s"
        for response in await asyncio.gather(*tasks):
            assert response.status == 200
            response.release()
    assert (await proxy_series(gateway_sidecar))[QUEUED] == baseline  # and leaves with it


async def test_kv_usage_is_the_larger_of_the_engine_gauge_and_the_reserved_share(
    fake_vllm: FakeVllm, gateway_sidecar: RunningSidecar
) -> None:
    fake_vllm.state.set_kv_usage(0.42)
    await asyncio.sleep(3 * INTERVAL)
    assert (await proxy_series(gateway_sidecar))[KV_USAGE] == pytest.approx(0.42)


async def test_metrics_on_the_proxy_port_stay_fast_under_load(
    fake_vllm: FakeVllm, gateway_sidecar: RunningSidecar
) -> None:
    """Eight connections of completions; /metrics latency p99 stays small (bench/gateway_metrics reports it)."""
    fake_vllm.state.response_delay = 0.0
    stop = asyncio.Event()
    short = {"model": "tiny", "prompt": list(range(10)), "max_tokens": 4}

    async def load(session: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            async with session.post(gateway_sidecar.proxy + "/v1/completions", json=short) as response:
                await response.read()

    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        workers = [asyncio.create_task(load(session)) for _ in range(8)]
        await asyncio.sleep(0.3)
        for _ in range(200):
            started = time.perf_counter()
            async with session.get(gateway_sidecar.proxy + "/metrics") as response:
                await response.read()
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.005)
        stop.set()
        await asyncio.gather(*workers)
    p99 = statistics.quantiles(latencies, n=100)[98]
    # one process holds the clients, the proxy and the fake engine on 2 cores: a margin for CI, the bench
    # measures the sidecar on its own
    assert p99 < 0.05, f"/metrics p99 {p99 * 1000:.1f} ms under load"


async def test_kv_usage_includes_what_capacity_admission_reserved(fake_vllm: FakeVllm) -> None:
    """A long request in flight reserves 5 of the pool's 15 usable blocks while the engine's gauge says 0.1."""
    fake_vllm.state.set_kv_usage(0.1)
    fake_vllm.state.response_delay = 1.0
    sidecar = await start_sidecar(fake_vllm.url, proxy=True)
    try:
        await asyncio.sleep(3 * INTERVAL)
        async with aiohttp.ClientSession() as session:
            body = {"model": "tiny", "prompt": LONG, "max_tokens": 8}
            task = asyncio.create_task(session.post(sidecar.proxy + "/v1/completions", json=body))
            await asyncio.sleep(0.3)
            usage = (await proxy_series(sidecar))[KV_USAGE]
            (await task).release()
        assert usage == pytest.approx(5 / 15)  # ceil((600 + 8) / 128) blocks of 16 - 1 usable
        assert (await proxy_series(sidecar))[KV_USAGE] == pytest.approx(0.1)  # released with the answer
    finally:
        await sidecar.app.stop()


def raw_get(sock: socket.socket, path: str) -> tuple[dict[str, str], bytes]:
    """One GET on a kept-alive socket: the answer's headers (lower-case names) and body."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: pod\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0].startswith("HTTP/1.1 200"), lines[0]
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return headers, body


async def test_a_scrape_only_connection_is_answered_by_the_connection_itself(
    gateway_sidecar: RunningSidecar,
) -> None:
    """The EPP's way (a connection that only scrapes) gets the guard's answer; any other gets aiohttp's route.

    Both say the same: the same families, the same gateway series, the same content type.
    """
    await asyncio.sleep(3 * INTERVAL)
    port = int(gateway_sidecar.proxy.rsplit(":", 1)[1])

    def scrape_both() -> tuple[tuple[dict[str, str], bytes], tuple[dict[str, str], bytes]]:
        with (
            socket.create_connection(("127.0.0.1", port)) as only,
            socket.create_connection(("127.0.0.1", port)) as mixed,
        ):
            raw_get(only, "/metrics")  # keep-alive: the second answer comes on the same connection
            fast = raw_get(only, "/metrics")
            raw_get(mixed, "/v1/models")  # aiohttp has this connection from its first request on
            return fast, raw_get(mixed, "/metrics")

    (fast_headers, fast_body), (routed_headers, routed_body) = await asyncio.to_thread(scrape_both)
    assert fast_headers["server"] == "kv-sidecar"
    assert "aiohttp" in routed_headers["server"]
    assert fast_headers["content-type"] == routed_headers["content-type"]

    def families(body: bytes) -> dict[str, float]:
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
            if not sample.labels
        }

    fast, routed = families(fast_body), families(routed_body)
    assert fast.keys() == routed.keys()
    assert {QUEUED, RUNNING, KV_USAGE} <= fast.keys()
    assert fast[QUEUED] == routed[QUEUED]
