"""What the e2e tests of one engine's KV behaviour share: a sidecar beside it, its status, a spike both ways."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from sidecar.app import SidecarApp
from tests.e2e.test_real_vllm import start
from tests.harness.spike import SpikeConfig, SpikeReport, run_spike, wait_idle


async def start_beside(engine: str, model: Path | None, **options: object) -> SidecarApp:
    """A sidecar in front of ``engine`` (``options``: more :class:`RunOptions`) that has read its first page
    and its ``max_model_len``."""
    app = await start(engine, model, **options)
    for _ in range(100):
        if app.monitor.engine.snapshot is not None and app.monitor.request_max_model_len() is not None:
            break
        await asyncio.sleep(0.1)
    return app


async def admission_status(app: SidecarApp) -> dict[str, object]:
    """The ``admission`` part of the sidecar's ``/status``."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{app.admin_port}/status") as response,
    ):
        document = await response.json()
    return dict(document["admission"])


async def straight_then_through(
    engine: str, model: Path, spike: SpikeConfig
) -> tuple[SpikeReport, SpikeReport, object]:
    """The spike straight (which must preempt, or the test tests nothing), then through a fresh sidecar.

    Returns both reports and the ``kv_layout`` the sidecar's ``/status`` showed before its run.
    """
    await wait_idle(engine)
    direct = await run_spike(engine, engine, spike, "direct")
    assert direct.preemptions >= 1, "straight did not preempt: the test no longer tests anything"
    await wait_idle(engine)
    app = await start_beside(engine, model)
    try:
        layout = (await admission_status(app))["kv_layout"]
        proxied = await run_spike(f"http://127.0.0.1:{app.proxy_port}", engine, spike, "sidecar")
    finally:
        await app.drain()
        await app.stop()
    print("\ndirect:", direct.summary(), "\nsidecar:", proxied.summary())
    assert direct.summary()["lost"] == proxied.summary()["lost"] == 0
    return direct, proxied, layout
