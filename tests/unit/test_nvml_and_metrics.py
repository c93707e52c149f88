"""The NVML reader against a fake NVML, and the exposition of the sidecar's own metrics."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.nvml import NvmlReader
from sidecar.monitor.planning import PlanInputs
from sidecar.server.metrics import MonitorCollector
from sidecar.signals import parse_vllm_metrics
from sidecar.units import GIB, MIB
from tests.fake_vllm import PRESSURE_PAGE, page


class NVMLError(Exception):
    pass


class FakeNvml:
    """The parts of pynvml the reader calls, with one 24 GiB GPU."""

    nvmlMemory_v2 = 2  # noqa: N815 - pynvml's name
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, *, fail_init: bool = False, power: bool = True) -> None:
        self.fail_init = fail_init
        self.power = power
        self.used = 20 * GIB
        self.lost = False
        self.shutdowns = 0

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.fail_init:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        if self.lost:
            raise NVMLError("GPU is lost")
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:  # noqa: N802
        return b"NVIDIA GeForce RTX 4090"

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:  # noqa: N802
        return SimpleNamespace(total=24 * GIB, used=self.used, free=24 * GIB - self.used, reserved=300 * MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:  # noqa: N802
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:  # noqa: N802
        if not self.power:
            raise NVMLError("Not Supported")
        return 312_500

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:  # noqa: N802
        return 66

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:  # noqa: N802
        return [SimpleNamespace(pid=4242, usedGpuMemory=19 * GIB), SimpleNamespace(pid=7, usedGpuMemory=None)]


def _logs(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_reader_reads_every_field() -> None:
    stream = io.StringIO()
    reader = NvmlReader(make_logger(stream), FakeNvml())
    (gpu,) = reader.read()
    assert (gpu.name, gpu.total_bytes, gpu.used_bytes, gpu.reserved_bytes) == (
        "NVIDIA GeForce RTX 4090",
        24 * GIB,
        20 * GIB,
        300 * MIB,
    )
    assert (gpu.utilization_ratio, gpu.power_watts, gpu.temperature_celsius) == (0.87, 312.5, 66.0)
    assert [(p.pid, p.used_bytes) for p in gpu.processes] == [(4242, 19 * GIB), (7, None)]
    assert reader.available is True
    assert _logs(stream) == []


def test_unsupported_field_is_none() -> None:
    (gpu,) = NvmlReader(make_logger(io.StringIO()), FakeNvml(power=False)).read()
    assert gpu.power_watts is None


def test_no_driver_is_one_unavailable_state_logged_once() -> None:
    stream = io.StringIO()
    reader = NvmlReader(make_logger(stream), FakeNvml(fail_init=True))
    for _ in range(5):
        assert reader.read() == []
    assert reader.available is False
    assert "Driver Not Loaded" in (reader.unavailable_reason or "")
    assert [e["event"] for e in _logs(stream)] == ["nvml_unavailable"]


def test_lost_gpu_and_recovery_log_each_transition_once() -> None:
    stream = io.StringIO()
    nvml = FakeNvml()
    reader = NvmlReader(make_logger(stream), nvml)
    reader.read()
    nvml.lost = True
    reader.read()
    reader.read()
    nvml.lost = False
    assert len(reader.read()) == 1
    assert [e["event"] for e in _logs(stream)] == ["nvml_unavailable", "nvml_available"]


def test_real_pynvml_on_a_machine_without_a_gpu_is_unavailable_not_a_crash() -> None:
    reader = NvmlReader(make_logger(io.StringIO()))  # imports the real pynvml module
    gpus = reader.read()
    if gpus:  # a machine with a GPU: the real reader worked
        assert reader.available is True
        assert gpus[0].total_bytes > 0
    else:
        assert reader.available is False
        assert reader.unavailable_reason


async def test_read_async_runs_off_the_loop() -> None:
    reader = NvmlReader(make_logger(io.StringIO()), FakeNvml())
    assert len(await reader.read_async()) == 1
    reader.close()


def _families(registry: CollectorRegistry) -> dict[str, Any]:
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_exposition_names_and_values() -> None:
    monitor = Monitor(PlanInputs(), MonitorSettings(), make_logger(io.StringIO()))
    registry = CollectorRegistry()
    registry.register(MonitorCollector(monitor, clock=lambda: 12.5))
    before = _families(registry)
    assert before["kv_sidecar_engine_up"].samples[0].value == 0.0
    assert before["kv_sidecar_engine_metrics_age_seconds"].samples[0].value == float("inf")
    monitor.record_success(parse_vllm_metrics(page(PRESSURE_PAGE)), now=10.0)
    nvml = NvmlReader(make_logger(io.StringIO()), FakeNvml())
    monitor.record_gpus(nvml.read(), True, None)
    after = _families(registry)
    assert after["kv_sidecar_engine_kv_cache_usage_ratio"].samples[0].value == 1.0
    assert after["kv_sidecar_engine_metrics_age_seconds"].samples[0].value == 2.5
    requests = {s.labels["state"]: s.value for s in after["kv_sidecar_engine_requests"].samples}
    assert requests == {"running": 3.0, "waiting": 5.0}
    assert after["kv_sidecar_engine_preemptions"].type == "counter"
    pools = {s.labels["source"]: s.value for s in after["kv_sidecar_kv_pool_tokens"].samples}
    assert pools == {"engine": 2048.0}
    memory = {s.labels["kind"]: s.value for s in after["kv_sidecar_gpu_memory_bytes"].samples}
    assert memory["total"] == 24 * GIB
    assert memory["peak"] == 20 * GIB
    active = {s.labels["id"]: s.value for s in after["kv_sidecar_diagnosis_active"].samples}
    assert active["no-prediction"] == 1.0
    assert after["kv_sidecar_build_info"].samples[0].labels["version"]


@pytest.mark.parametrize("name", ["kv_sidecar_budget_bytes", "kv_sidecar_max_concurrency"])
def test_prediction_metrics_appear_with_a_model(name: str) -> None:
    from tests.unit.test_monitor_core import TINY  # noqa: PLC0415

    monitor = Monitor(
        PlanInputs(architecture=TINY, gpu_memory_bytes=24 * GIB), MonitorSettings(), make_logger()
    )
    registry = CollectorRegistry()
    registry.register(MonitorCollector(monitor, clock=lambda: 0.0))
    monitor.engine.max_model_len = 1024
    monitor.record_success(parse_vllm_metrics(page(PRESSURE_PAGE)), now=0.0)
    samples = _families(registry)[name.removesuffix("_total")].samples
    assert samples
    assert all(s.value == s.value for s in samples)  # no NaN


class HangingNvml(FakeNvml):
    """A driver call that hangs (a GPU fallen off the bus) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.calls = 0

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's name
        self.calls += 1
        self.release.wait(10)
        return 1


async def test_a_hanging_nvml_call_times_out_and_does_not_pile_up_threads() -> None:
    nvml, stream = HangingNvml(), io.StringIO()
    reader = NvmlReader(make_logger(stream), nvml, timeout=0.1)
    started = time.perf_counter()
    assert await reader.read_async() == []
    assert time.perf_counter() - started < 1.0
    assert reader.available is False
    assert "did not answer within 0.1s" in (reader.unavailable_reason or "")
    assert await reader.read_async() == []  # the first call still hangs: no second thread is started
    assert nvml.calls == 1
    nvml.release.set()
    await asyncio.sleep(0.05)
    assert len(await reader.read_async()) == 1  # the driver answers again: available
    assert reader.available is True
    assert [line["event"] for line in _logs(stream)] == ["nvml_unavailable", "nvml_available"]
    reader.close()
