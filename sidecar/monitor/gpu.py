"""What NVML says about one GPU, as plain data (the reader lives in :mod:`sidecar.monitor.nvml`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU (host pid; memory is ``None`` where the driver hides it)."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One GPU's memory, utilisation, power and temperature at one read."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None = None
    utilization_ratio: float | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    processes: tuple[GpuProcess, ...] = field(default=())
