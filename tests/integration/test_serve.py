"""``SidecarApp.serve``, the production entry point: start, settle the heap, stop on SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import io
import os
import signal

from sidecar.app import RunOptions, SidecarApp
from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.planning import PlanInputs
from tests.fake_vllm import FakeVllm


async def test_serve_freezes_the_start_up_heap_and_stops_on_sigterm(fake_vllm: FakeVllm) -> None:
    """Once serving, the start-up objects are frozen (no full collection walks them again); SIGTERM ends it."""
    gc.unfreeze()
    app = SidecarApp(
        RunOptions(
            upstream=fake_vllm.url, admin_listen=("127.0.0.1", 0), listen=("127.0.0.1", 0), nvml=False
        ),
        PlanInputs(),
        MonitorSettings(),
        make_logger(io.StringIO()),
    )
    serving = asyncio.create_task(app.serve())
    try:
        for _ in range(200):
            if app.admin_port and gc.get_freeze_count() > 0:
                break
            await asyncio.sleep(0.01)
        assert app.admin_port, "the sidecar did not start"
        assert gc.get_freeze_count() > 10_000, "serve() left the start-up heap to the collector"
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, timeout=10)
    finally:
        serving.cancel()
        gc.unfreeze()
