"""Prediction versus engine: the seeds' troubleshooting table, automated.

Theory of operation
-------------------
:func:`~sidecar.monitor.comparison.compare` lines up what the budget predicted with what the engine
reports (pool tokens and their drift, maximum concurrency against the target, the KV dtype asked for
against the one in effect, and what of the model the plan leaves out). :func:`diagnose` turns that
comparison, the engine's state, the GPU reads and the recent :class:`~sidecar.monitor.history.SignalHistory`
into :class:`Diagnosis` records, each with a stable ``id`` (used as a metric label, a log field and in
alerts), a severity, a one-line message and the seeds' advice. Both functions are pure: time comes in as
``now``.

| id | severity | when |
|---|---|---|
| ``engine-down`` | critical | the last scrape failed |
| ``engine-metrics-missing`` | warning | the page has neither KV-usage metric (renamed or not vLLM) |
| ``no-prediction`` | info | no ``--model`` given, so nothing to compare |
| ``model-unresolved`` | warning | ``--model`` could not be resolved (yet): no prediction; retried |
| ``drafter-unresolved`` | warning | the drafter's config could not be read (yet): predicted without it |
| ``kv-pool-drift`` | warning | engine pool differs from the prediction by more than 20% (info above 5%) |
| ``max-concurrency-below-one`` | critical | one full-length request does not fit the pool |
| ``max-concurrency-below-target`` | warning | fewer full-length requests fit than ``--concurrency`` |
| ``kv-dtype-not-in-effect`` | warning | e.g. FP8 asked for, the engine reports ``auto`` |
| ``gpu-memory-above-reservation`` | warning | NVML used > the engine's reservation + 2% of the card |
| ``gpu-memory-peak-near-total`` | warning | the window's peak leaves under 5% of the card free |
| ``requests-waiting-sustained`` | warning | requests waited on every scrape of the sustain window |
| ``preemptions-increasing`` | warning | the preemption counter grew within the window |
| ``kv-usage-high-sustained`` | warning | KV usage >= 0.85 on every scrape of the sustain window |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from sidecar.budget.dtypes import normalise_dtype, serving_dtype
from sidecar.budget.ledger import PlanRequest
from sidecar.budget.vllm_release import VllmRelease
from sidecar.monitor.comparison import Comparison
from sidecar.monitor.gpu import GpuSnapshot
from sidecar.monitor.history import SignalHistory
from sidecar.settings import default_of
from sidecar.signals.engines import BY_KIND
from sidecar.signals.kinds import EngineKind
from sidecar.signals.vllm import EngineSnapshot
from sidecar.units import format_gib

DRIFT_WARNING_RATIO: Final = 0.20
DRIFT_INFO_RATIO: Final = 0.05
HIGH_USAGE_THRESHOLD: Final = 0.85
RESERVATION_TOLERANCE_FRACTION: Final = 0.02
PEAK_FREE_FRACTION: Final = 0.05
COLD_COMPILE_ADVICE: Final = (
    "a boot with an empty torch.compile cache charges the compile's temporaries to vLLM's start-up profile"
    " (vLLM issues #54122, #54383; not with --enforce-eager): restart vLLM with VLLM_CACHE_ROOT kept (the"
    " chart's compileCache volume) and the next boot sizes the warm pool"
)
"""Why a pool can come out smaller than planned on a first boot, and how to win it back: the same settings
boot 35,792 tokens cold and 43,040 warm (Qwen3-8B, RTX 4090, vLLM 0.27.1; ``FINDINGS.md``)."""


class Severity(StrEnum):
    """How bad a diagnosis is; ``check`` fails on ``warning`` and ``critical``."""

    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        """Order for comparisons: info < warning < critical."""
        return {"info": 0, "warning": 1, "critical": 2}[self.value]


class DiagnosisId(StrEnum):
    """Every diagnosis id, written once: metric label, log field, alert rule and README row derive from it."""

    ENGINE_DOWN = "engine-down"
    ENGINE_METRICS_MISSING = "engine-metrics-missing"
    NO_PREDICTION = "no-prediction"
    MODEL_UNRESOLVED = "model-unresolved"
    DRAFTER_UNRESOLVED = "drafter-unresolved"
    KV_POOL_DRIFT = "kv-pool-drift"
    MAX_CONCURRENCY_BELOW_ONE = "max-concurrency-below-one"
    MAX_CONCURRENCY_BELOW_TARGET = "max-concurrency-below-target"
    KV_DTYPE_NOT_IN_EFFECT = "kv-dtype-not-in-effect"
    GPU_MEMORY_ABOVE_RESERVATION = "gpu-memory-above-reservation"
    GPU_MEMORY_PEAK_NEAR_TOTAL = "gpu-memory-peak-near-total"
    REQUESTS_WAITING_SUSTAINED = "requests-waiting-sustained"
    PREEMPTIONS_INCREASING = "preemptions-increasing"
    KV_USAGE_HIGH_SUSTAINED = "kv-usage-high-sustained"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """One finding: stable id, severity, what is wrong, what to change."""

    id: DiagnosisId
    severity: Severity
    message: str
    advice: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {
            "id": self.id.value,
            "severity": self.severity.value,
            "message": self.message,
            "advice": self.advice,
        }


@dataclass(frozen=True, slots=True)
class MonitorSettings:
    """What the operator asked for, and how long "sustained" is."""

    target_concurrency: int = default_of(PlanRequest, "concurrency")
    requested_kv_dtype: str | None = None  # only when given explicitly
    model_dtype: str | None = None
    sustain_seconds: float = 60.0
    high_usage_threshold: float = HIGH_USAGE_THRESHOLD


def _dtype_in_effect(requested: str, reported: str, model_dtype: str | None) -> bool:
    want = normalise_dtype(requested)
    have = normalise_dtype(reported)
    if want == "auto":
        return have in {"auto", serving_dtype(model_dtype or "auto")}
    if have == "auto":
        return model_dtype is not None and want == serving_dtype(model_dtype)
    return want == have


def _budget_diagnoses(comparison: Comparison, settings: MonitorSettings) -> list[Diagnosis]:
    found: list[Diagnosis] = []
    drift = comparison.pool_drift_ratio
    if drift is not None and abs(drift) > DRIFT_INFO_RATIO:
        severity = Severity.WARNING if abs(drift) > DRIFT_WARNING_RATIO else Severity.INFO
        advice = (
            "check that the sidecar's flags (model, GPU, dtypes, gpu_memory_utilization,"
            " max_num_batched_tokens, --cpu-offload-gb, --max-lora-rank: vLLM's page names its LoRA"
            " slots, not their rank) match vLLM's; another process on the GPU or a larger activation"
            " peak shrinks the pool"
        )
        release = comparison.vllm_release
        if drift < 0 and comparison.plan_gaps:
            advice = f"{comparison.plan_gaps}: trust the engine's pool (admission does); " + advice
        if drift < 0 and comparison.compiles:
            advice = f"{COLD_COMPILE_ADVICE}; " + advice
        if drift < 0 and release and VllmRelease.parse(release).counts_pinned_profile_segments():
            advice = (
                f"vLLM {release} counts allocator segments freed during its start-up profile as used"
                " (fixed in 0.31.0): upgrade vLLM, or raise gpu_memory_utilization to win the pool back; "
                + advice
            )
        found.append(
            Diagnosis(
                DiagnosisId.KV_POOL_DRIFT,
                severity,
                f"engine KV pool is {comparison.engine_pool_tokens:,} tokens, predicted "
                f"{comparison.predicted_pool_tokens:,} ({drift:+.0%})",
                advice,
            )
        )
    concurrency = comparison.engine_max_concurrency
    if concurrency is None:
        concurrency = comparison.predicted_max_concurrency
    if concurrency is not None and comparison.max_model_len:
        source = "engine" if comparison.engine_max_concurrency is not None else "prediction"
        if concurrency < 1:
            found.append(
                Diagnosis(
                    DiagnosisId.MAX_CONCURRENCY_BELOW_ONE,
                    Severity.CRITICAL,
                    f"the KV pool holds {concurrency:.2f}x of one {comparison.max_model_len:,}-token request "
                    f"({source}): a full-length request cannot run",
                    "lower --max-model-len, use an FP8 KV cache, or quantise the weights (INT8/INT4)",
                )
            )
        elif concurrency < comparison.target_concurrency:
            found.append(
                Diagnosis(
                    DiagnosisId.MAX_CONCURRENCY_BELOW_TARGET,
                    Severity.WARNING,
                    f"the KV pool holds {concurrency:.2f} full-length requests ({source}), "
                    f"below the target {comparison.target_concurrency}",
                    "use an FP8 KV cache, quantise the weights, lower --max-model-len, or accept queueing",
                )
            )
    requested, reported = comparison.requested_kv_dtype, comparison.engine_kv_dtype
    if requested and reported and not _dtype_in_effect(requested, reported, settings.model_dtype):
        found.append(
            Diagnosis(
                DiagnosisId.KV_DTYPE_NOT_IN_EFFECT,
                Severity.WARNING,
                f"KV cache dtype {requested} was requested but the engine reports cache_dtype={reported!r}",
                f"start vLLM with --kv-cache-dtype {requested} and check the GPU supports it"
                " (FP8 KV needs Ada, Hopper or newer); otherwise quantise the weights instead",
            )
        )
    return found


def _gpu_diagnoses(
    gpus: list[GpuSnapshot], utilization: float | None, history: SignalHistory
) -> list[Diagnosis]:
    found: list[Diagnosis] = []
    for gpu in gpus:
        if utilization is not None:
            reservation = math.ceil(gpu.total_bytes * utilization)
            if gpu.used_bytes > reservation + RESERVATION_TOLERANCE_FRACTION * gpu.total_bytes:
                others = f"; {len(gpu.processes)} processes hold memory" if gpu.processes else ""
                found.append(
                    Diagnosis(
                        DiagnosisId.GPU_MEMORY_ABOVE_RESERVATION,
                        Severity.WARNING,
                        f"GPU {gpu.index} uses {format_gib(gpu.used_bytes)}, "
                        f"above the engine's reservation of "
                        f"{format_gib(reservation)} (gpu_memory_utilization {utilization}){others}",
                        "another process or activation spikes use memory vLLM did not reserve: move the other"
                        " process, lower --max-num-batched-tokens, or lower --gpu-memory-utilization",
                    )
                )
    peak_steady = history.peak_and_steady(lambda o: o.gpu_used_bytes)
    if peak_steady and gpus:
        peak, steady = peak_steady
        total = sum(g.total_bytes for g in gpus) / len(gpus)
        if total - peak < PEAK_FREE_FRACTION * total:
            found.append(
                Diagnosis(
                    DiagnosisId.GPU_MEMORY_PEAK_NEAR_TOTAL,
                    Severity.WARNING,
                    f"peak GPU memory {format_gib(peak)} leaves under 5% of {format_gib(total)} free "
                    f"(steady {format_gib(steady)}, margin {format_gib(peak - steady)})",
                    "the peak-to-steady gap is the real safety margin: lower --gpu-memory-utilization or"
                    " --max-num-batched-tokens before an activation spike runs out of memory",
                )
            )
    return found


def _load_diagnoses(history: SignalHistory, now: float, settings: MonitorSettings) -> list[Diagnosis]:
    found: list[Diagnosis] = []
    window = settings.sustain_seconds
    if history.sustained(now, window, lambda o: (o.waiting or 0) > 0):
        found.append(
            Diagnosis(
                DiagnosisId.REQUESTS_WAITING_SUSTAINED,
                Severity.WARNING,
                f"requests have been waiting for at least {window:g}s",
                "the engine cannot run more at once: raise --max-num-seqs if memory allows, or free KV space"
                " (FP8 KV cache, quantised weights) before raising it",
            )
        )
    preempted = history.increase(now, window, lambda o: o.preemptions_total)
    if preempted > 0:
        found.append(
            Diagnosis(
                DiagnosisId.PREEMPTIONS_INCREASING,
                Severity.WARNING,
                f"{preempted:g} preemptions in the last {window:g}s: the KV cache ran out mid-generation",
                "lower --max-num-seqs one step and let requests queue, or admit long prompts one at a time",
            )
        )
    threshold = settings.high_usage_threshold
    if history.sustained(now, window, lambda o: o.kv_usage is not None and o.kv_usage >= threshold):
        found.append(
            Diagnosis(
                DiagnosisId.KV_USAGE_HIGH_SUSTAINED,
                Severity.WARNING,
                f"KV cache usage has stayed at or above {threshold:.0%} for at least {window:g}s",
                "lower --max-num-seqs one step and let requests queue rather than push the pool to its limit",
            )
        )
    return found


def _metrics_missing(kind: EngineKind) -> Diagnosis:
    if kind is EngineKind.VLLM:
        message = "the engine's page has neither vllm:kv_cache_usage_perc nor vllm:gpu_cache_usage_perc"
        advice = "check that --upstream is a vLLM server and whether this vLLM version renamed the metric"
    else:
        message = f"the {kind} page reports no KV-cache usage ({BY_KIND[kind].kv_usage.name})"
        advice = f"check the {kind} version and its metrics settings; admission decides without the gauge"
    return Diagnosis(DiagnosisId.ENGINE_METRICS_MISSING, Severity.WARNING, message, advice)


def diagnose(
    *,
    comparison: Comparison,
    engine_up: bool,
    snapshot: EngineSnapshot | None,
    predicted: bool,
    gpus: list[GpuSnapshot],
    history: SignalHistory,
    now: float,
    settings: MonitorSettings,
    model_error: str | None = None,
    drafter_error: str | None = None,
) -> list[Diagnosis]:
    """Everything wrong now, most severe first (``model_error``, ``drafter_error``: why not resolved)."""
    found: list[Diagnosis] = []
    if not engine_up:
        found.append(
            Diagnosis(
                DiagnosisId.ENGINE_DOWN,
                Severity.CRITICAL,
                "the engine's /metrics did not answer on the last scrape",
                "check that vLLM is running and --upstream points at it",
            )
        )
    if snapshot is not None and snapshot.kv_usage_metric is None:
        found.append(_metrics_missing(snapshot.kind))
    if model_error is not None:
        found.append(
            Diagnosis(
                DiagnosisId.MODEL_UNRESOLVED,
                Severity.WARNING,
                f"no budget prediction: {model_error}",
                "the sidecar keeps proxying and tries again (vLLM fills the HF cache as it loads); "
                "mount that cache into the sidecar (the chart does), or pass a model directory",
            )
        )
    elif not predicted:
        found.append(
            Diagnosis(
                DiagnosisId.NO_PREDICTION,
                Severity.INFO,
                "no budget prediction: give --model (and --gpu or --gpu-memory, or let NVML tell the GPU)",
                "pass the same model and settings vLLM runs with",
            )
        )
    if drafter_error is not None and predicted:
        found.append(
            Diagnosis(
                DiagnosisId.DRAFTER_UNRESOLVED,
                Severity.WARNING,
                f"the prediction leaves out the speculative drafter: {drafter_error}",
                "the sidecar tries again (vLLM downloads the drafter into the HF cache); mount that cache "
                "into the sidecar (the chart does), or give the drafter as a directory",
            )
        )
    found += _budget_diagnoses(comparison, settings)
    utilization = snapshot.cache_config.gpu_memory_utilization if snapshot and snapshot.cache_config else None
    found += _gpu_diagnoses(gpus, utilization, history)
    found += _load_diagnoses(history, now, settings)
    return sorted(found, key=lambda d: -d.severity.rank)
