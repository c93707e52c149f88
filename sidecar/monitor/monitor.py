"""The monitor: the engine's latest state, the GPU reads, the prediction and the diagnoses.

One :class:`Monitor` is created by the application and passed to whoever needs it (scraper,
collectors, admin handlers); it holds state but does no I/O of its own. The scraper reports each
scrape's outcome through :meth:`Monitor.record_success` / :meth:`Monitor.record_failure` with the
time it happened; the monitor then rebuilds the prediction when the engine's settings changed,
updates the history and the diagnoses, and logs one line per change of state (engine up/down,
a diagnosis appearing or clearing), never one per scrape.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from structlog.typing import FilteringBoundLogger

from sidecar.budget.architecture import Architecture
from sidecar.budget.ledger import Ledger, PlanRequest, build_ledger
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.errors import KvSidecarError
from sidecar.monitor.comparison import Comparison, compare
from sidecar.monitor.diagnose import Diagnosis, MonitorSettings, Severity, diagnose
from sidecar.monitor.gpu import GpuSnapshot
from sidecar.monitor.history import SignalHistory, observation
from sidecar.monitor.planning import PlanInputs, resolve_plan_request
from sidecar.signals.vllm import EngineSnapshot


@dataclass(slots=True)
class EngineState:
    """What the sidecar knows about the engine right now."""

    up: bool | None = None
    snapshot: EngineSnapshot | None = None
    last_success_at: float | None = None
    sampled_at: float | None = None  # when the last good page was asked for (it shows the engine after it)
    last_error: str | None = None
    consecutive_failures: int = 0
    max_model_len: int | None = None
    served_model: str | None = None
    version: str | None = None  # what GET /version says

    own_delay: float = 0.0  # seconds the sidecar itself asked late since the last good page
    scrape_delay: float | None = None  # the wait before the next round: interval, calm interval or backoff

    def metrics_age(self, now: float) -> float | None:
        """Seconds since the last successful scrape, less the sidecar's own lateness in asking for the next.

        ``None`` before the first. A sidecar whose event loop is busy (a burst of a thousand connections)
        asks for the next page late; that delay is its own, not the engine's, so it does not make the
        engine's metrics stale (and the stale policy, meant for an engine that stops answering, does
        not take over): only the time the engine took to answer, or did not, counts.
        """
        if self.last_success_at is None:
            return None
        return max(0.0, now - self.last_success_at - self.own_delay)


@dataclass(slots=True)
class GpuState:
    """The latest NVML read."""

    enabled: bool = False
    available: bool | None = None
    unavailable_reason: str | None = None
    gpus: list[GpuSnapshot] = field(default_factory=list)
    peak_used_bytes: dict[int, int] = field(default_factory=dict)


class Monitor:
    """Owns engine, GPU, prediction and diagnosis state; see the module docstring."""

    def __init__(
        self,
        inputs: PlanInputs,
        settings: MonitorSettings,
        log: FilteringBoundLogger,
        history_window: float = 600.0,
    ) -> None:
        self.inputs = inputs
        self.settings = settings
        self.engine = EngineState()
        self.gpu = GpuState()
        self.history = SignalHistory(window=max(history_window, settings.sustain_seconds * 2))
        self.request: PlanRequest | None = None
        self.ledger: Ledger | None = None
        self.plan_error: str | None = None
        self.comparison: Comparison = compare(None, None, max_model_len=None, settings=settings)
        self.diagnoses: list[Diagnosis] = []
        self.model_error: str | None = None  # why ``--model`` did not resolve (``run`` retries)
        self.model_source: str | None = None  # where it resolved from: path, hf-cache, hub, catalog
        self._log = log

    def set_architecture(self, architecture: Architecture, source: str) -> None:
        """``--model`` resolved (perhaps late): predict with it from the next refresh on."""
        self.inputs = replace(self.inputs, architecture=architecture)
        self.model_error, self.model_source = None, source

    def set_speculative(self, speculative: SpeculativeSettings) -> None:
        """A drafter's model resolved late: predict with its weights and KV from the next refresh on."""
        self.inputs = replace(self.inputs, speculative=speculative)

    def update_prediction(self) -> None:
        """Rebuild the prediction when its inputs (flags + engine-reported settings) changed."""
        snapshot = self.engine.snapshot
        total = self.gpu.gpus[0].total_bytes if self.gpu.gpus else None
        try:
            request = resolve_plan_request(
                self.inputs,
                snapshot.cache_config if snapshot else None,
                self.engine.max_model_len,
                total,
                engine_version=self.engine.version,
                gpu_name=self.gpu.gpus[0].name if self.gpu.gpus else "nvml",
                engine_count=len(snapshot.engines) if snapshot else None,  # data-parallel engines
                engine_max_loras=snapshot.max_loras if snapshot else None,  # --enable-lora's slots
            )
            ledger = build_ledger(request) if request and request != self.request else self.ledger
            error: str | None = None
        except KvSidecarError as exc:
            request, ledger, error = None, None, str(exc)
        if error != self.plan_error and error is not None:
            self._log.warning("prediction_unavailable", reason=error)
        self.plan_error = error
        if request != self.request:
            self.request = request
            self.ledger = ledger if request else None
            if self.ledger:
                self._log.info(
                    "prediction",
                    kv_pool_tokens=self.ledger.kv_pool_tokens,
                    max_concurrency=self.ledger.max_concurrency,
                    verdict=self.ledger.verdict.value,
                )

    def record_gpus(self, gpus: list[GpuSnapshot], available: bool | None, reason: str | None) -> None:
        """Store an NVML read (an empty list while unavailable)."""
        self.gpu.available, self.gpu.unavailable_reason = available, reason
        self.gpu.gpus = gpus
        for gpu in gpus:
            self.gpu.peak_used_bytes[gpu.index] = max(
                self.gpu.peak_used_bytes.get(gpu.index, 0), gpu.used_bytes
            )

    def record_success(self, snapshot: EngineSnapshot, now: float, sampled_at: float | None = None) -> None:
        """A scrape asked for at ``sampled_at`` (default ``now``) succeeded at ``now``."""
        if self.engine.up is not True:
            self._log.info("engine_up", model=snapshot.model_name, kv_usage_metric=snapshot.kv_usage_metric)
        self.engine.up = True
        self.engine.snapshot = snapshot
        self.engine.last_success_at = now
        self.engine.own_delay = 0.0
        self.engine.sampled_at = now if sampled_at is None else sampled_at
        self.engine.last_error = None
        self.engine.consecutive_failures = 0
        self.history.add(observation(now, snapshot, self.gpu.gpus))
        self.refresh(now)

    def record_failure(self, error: str, now: float) -> None:
        """A scrape failed at ``now`` with a one-line ``error``."""
        if self.engine.up is not False:
            self._log.warning("engine_down", error=error)
        self.engine.up = False
        self.engine.last_error = error
        self.engine.consecutive_failures += 1
        self.refresh(now)

    def refresh(self, now: float) -> None:
        """Recompute prediction, comparison and diagnoses; log the diagnoses that appeared or cleared."""
        self.update_prediction()
        snapshot = self.engine.snapshot
        self.comparison = compare(
            self.ledger, snapshot, max_model_len=self.request_max_model_len(), settings=self.settings
        )
        found = diagnose(
            comparison=self.comparison,
            engine_up=bool(self.engine.up),
            snapshot=snapshot,
            predicted=self.ledger is not None,
            gpus=self.gpu.gpus,
            history=self.history,
            now=now,
            settings=self.settings,
            model_error=self.model_error,
            drafter_error=self._drafter_error(),
        )
        before = {d.id for d in self.diagnoses}
        after = {d.id for d in found}
        for diagnosis in found:
            if diagnosis.id not in before and diagnosis.id != "engine-down":
                emit = self._log.info if diagnosis.severity is Severity.INFO else self._log.warning
                emit("diagnosis", **diagnosis.to_dict())
        for cleared in sorted(before - after):
            self._log.info("diagnosis_cleared", id=cleared)
        self.diagnoses = found

    def _drafter_error(self) -> str | None:
        spec = self.inputs.speculative
        return spec.drafter_problem if spec is not None and spec.drafter is None else None

    def request_max_model_len(self) -> int | None:
        """The max_model_len in force: the flag, else the engine's."""
        if self.request is not None:
            return self.request.effective_max_model_len
        return self.inputs.max_model_len or self.engine.max_model_len
