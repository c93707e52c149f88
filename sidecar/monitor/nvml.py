"""Reading GPU memory, utilisation, power and temperature through NVML (``pynvml``).

Every NVML call blocks (it talks to the driver), so the async entry point
:meth:`NvmlReader.read_async` runs the read in a worker thread. No GPU, no driver, or no
permission is one state, *unavailable*, with a reason: logged once when it begins, exported as
a metric, and never an exception to the caller. Per-field failures (a card that does not report
power, say) leave that field ``None``. The NVML module is injectable so tests can hand in a fake.

A driver call can hang (a GPU falling off the bus, a wedged driver): :meth:`NvmlReader.read_async`
waits at most ``timeout`` seconds, then reports *unavailable* ("NVML did not answer within ...").
The hung thread cannot be interrupted, so no new read starts while it is still running: one stuck
call costs one thread, never a growing pile of them.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from structlog.typing import FilteringBoundLogger

from sidecar.monitor.gpu import GpuProcess, GpuSnapshot

NVML_TIMEOUT_SECONDS = 2.0
MILLIWATTS_PER_WATT = 1000.0
PERCENT = 100.0


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Reads every visible GPU; see the module docstring for the unavailable state."""

    def __init__(
        self, log: FilteringBoundLogger, nvml: Any | None = None, *, timeout: float = NVML_TIMEOUT_SECONDS
    ) -> None:
        self._log = log
        self._nvml = nvml
        self._timeout = timeout
        self._pending: asyncio.Future[list[GpuSnapshot]] | None = None
        self._initialised = False
        self.available: bool | None = None  # None until the first read
        self.unavailable_reason: str | None = None

    def _mark_unavailable(self, reason: str) -> list[GpuSnapshot]:
        if self.available is not False:
            self._log.warning("nvml_unavailable", reason=reason)
        self.available = False
        self.unavailable_reason = reason
        return []

    def _init(self) -> Any:
        nvml = self._nvml
        if nvml is None:
            nvml = importlib.import_module("pynvml")
            self._nvml = nvml
        if not self._initialised:
            nvml.nvmlInit()
            self._initialised = True
        return nvml

    def _optional(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except Exception:  # noqa: BLE001 - NVML raises a family of NVMLError subclasses per unsupported field
            return None

    def _read_device(self, nvml: Any, index: int) -> GpuSnapshot:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
            reserved = int(memory.reserved)
        except Exception:  # noqa: BLE001 - drivers before v2 memory info
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            reserved = None
        util = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        power = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        temperature = self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        processes = self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return GpuSnapshot(
            index=index,
            name=_text(self._optional(nvml.nvmlDeviceGetName, handle) or f"gpu{index}"),
            total_bytes=int(memory.total),
            used_bytes=int(memory.used),
            free_bytes=int(memory.free),
            reserved_bytes=reserved,
            utilization_ratio=util.gpu / PERCENT if util is not None else None,
            power_watts=power / MILLIWATTS_PER_WATT if power is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            processes=tuple(
                GpuProcess(int(p.pid), int(p.usedGpuMemory) if p.usedGpuMemory is not None else None)
                for p in processes
            ),
        )

    def read(self) -> list[GpuSnapshot]:
        """Read every GPU (blocking); an empty list while NVML is unavailable."""
        try:
            nvml = self._init()
            count = int(nvml.nvmlDeviceGetCount())
            if count == 0:
                return self._mark_unavailable("NVML sees no GPU")
            snapshots = [self._read_device(nvml, i) for i in range(count)]
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, NoPermission, GpuIsLost ...
            return self._mark_unavailable(f"{type(exc).__name__}: {exc}".strip())
        if self.available is False:
            self._log.info("nvml_available", gpus=len(snapshots))
        self.available, self.unavailable_reason = True, None
        return snapshots

    async def read_async(self) -> list[GpuSnapshot]:
        """:meth:`read` in a worker thread, at most ``timeout`` seconds; the event loop never waits on it."""
        if self._pending is not None and not self._pending.done():
            return self._mark_unavailable(
                f"NVML did not answer within {self._timeout:g}s (a call still hangs)"
            )
        self._pending = asyncio.ensure_future(asyncio.to_thread(self.read))
        try:
            return await asyncio.wait_for(asyncio.shield(self._pending), self._timeout)
        except TimeoutError:
            return self._mark_unavailable(f"NVML did not answer within {self._timeout:g}s")

    def close(self) -> None:
        """Shut NVML down if it was initialised."""
        if self._initialised and self._nvml is not None:
            self._optional(self._nvml.nvmlShutdown)
            self._initialised = False
