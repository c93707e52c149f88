"""History, planning and diagnoses: the pure parts of the monitor, at their boundaries."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger, resolve_model
from sidecar.monitor.comparison import compare
from sidecar.monitor.diagnose import MonitorSettings, Severity, diagnose
from sidecar.monitor.gpu import GpuProcess, GpuSnapshot
from sidecar.monitor.history import Observation, SignalHistory
from sidecar.monitor.planning import PlanInputs, resolve_plan_request
from sidecar.signals import parse_vllm_metrics
from sidecar.units import GIB
from tests.fake_vllm import PRESSURE_PAGE, TINY_CONFIG, page, substitute_label

TINY = architecture_from_config(TINY_CONFIG)


def history_of(*points: tuple[float, float | None, float | None, float | None]) -> SignalHistory:
    history = SignalHistory(window=600)
    for at, usage, waiting, preemptions in points:
        history.add(Observation(at=at, kv_usage=usage, waiting=waiting, preemptions_total=preemptions))
    return history


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (60.0, True),  # history reaches back exactly 60 s
        (59.999, False),  # not yet 60 s of history
    ],
)
def test_sustained_needs_the_whole_duration(now: float, expected: bool) -> None:
    history = history_of(*[(t, 0.9, 0, 0) for t in (0.0, 20.0, 40.0, now)])
    assert history.sustained(now, 60.0, lambda o: (o.kv_usage or 0) >= 0.85) is expected


def test_sustained_breaks_on_one_low_sample_and_counts_the_anchor() -> None:
    history = history_of((0, 0.9, 0, 0), (30, 0.84, 0, 0), (61, 0.9, 0, 0), (100, 0.9, 0, 0))
    assert not history.sustained(
        100, 60, lambda o: (o.kv_usage or 0) >= 0.85
    )  # 0.84 at t=30 was in force at 40
    assert history.sustained(130, 60, lambda o: (o.kv_usage or 0) >= 0.85)


def test_threshold_exactly_at_the_boundary_counts() -> None:
    history = history_of((0, 0.85, 0, 0), (60, 0.85, 0, 0))
    assert history.sustained(60, 60, lambda o: (o.kv_usage or 0) >= 0.85)


def test_counter_increase_handles_resets() -> None:
    history = history_of((0, None, None, 5), (10, None, None, 7), (20, None, None, 1), (30, None, None, 3))
    assert history.increase(30, 100, lambda o: o.preemptions_total) == 2 + 1 + 2
    assert history.increase(30, 5, lambda o: o.preemptions_total) == 2  # from the value in force at t=25
    assert history.increase(30, 100, lambda o: o.waiting) == 0


def test_history_forgets_beyond_the_window_but_keeps_an_anchor() -> None:
    history = SignalHistory(window=10)
    for t in range(100):
        history.add(Observation(at=float(t), kv_usage=1.0))
    assert len(history) == 11  # t = 89 (the anchor) .. 99
    assert history.sustained(99, 10, lambda o: o.kv_usage == 1.0)


def test_peak_and_steady() -> None:
    history = SignalHistory(window=100)
    for t, used in enumerate([10, 10, 10, 30, 10]):
        history.add(Observation(at=float(t), gpu_used_bytes=used))
    assert history.peak_and_steady(lambda o: o.gpu_used_bytes) == (30, 10)
    assert SignalHistory(1).peak_and_steady(lambda o: o.gpu_used_bytes) is None


def _snapshot(cache_dtype: str = "auto"):  # type: ignore[no-untyped-def]
    return parse_vllm_metrics(
        substitute_label(page(PRESSURE_PAGE), "vllm:cache_config_info", "cache_dtype", cache_dtype)
    )


def test_planning_prefers_flags_then_engine_then_defaults() -> None:
    snap = _snapshot()
    config = snap.cache_config
    inputs = PlanInputs(architecture=TINY, gpu_memory_bytes=24 * GIB)
    request = resolve_plan_request(inputs, config, 1024, None)
    assert request is not None
    assert (request.block_size, request.gpu_memory_utilization, request.num_gpu_blocks_override) == (
        128,
        0.92,
        16,
    )
    assert request.max_model_len == 1024
    assert request.kv_cache_dtype == "auto"
    assert request.kv_cache_memory_bytes == 1073741824  # the engine's KV space (CPU: VLLM_CPU_KVCACHE_SPACE)
    flagged = resolve_plan_request(replace(inputs, block_size=16, kv_cache_dtype="fp8"), config, 1024, None)
    assert flagged is not None
    assert (flagged.block_size, flagged.kv_cache_dtype) == (16, "fp8")
    no_engine = resolve_plan_request(inputs, None, None, None)
    assert no_engine is not None
    assert (no_engine.block_size, no_engine.effective_gpu_memory_utilization) == (16, 0.92)  # vLLM 0.32's


def test_a_hybrid_models_state_settings_come_from_the_flags_else_the_engine() -> None:
    """The engine reports its prefix caching and the SSM dtype its model hooks and platform settled on."""
    config = replace(
        _snapshot().cache_config,
        enable_prefix_caching=False,
        mamba_ssm_cache_dtype="float32",
        mamba_cache_dtype="float32",
    )
    inputs = PlanInputs(architecture=TINY, gpu_memory_bytes=24 * GIB)
    from_engine = resolve_plan_request(inputs, config, 1024, None)
    assert from_engine is not None
    assert (from_engine.enable_prefix_caching, from_engine.mamba_ssm_cache_dtype) == (False, "float32")
    assert from_engine.mamba_cache_dtype == "float32"
    flags = replace(
        inputs, enable_prefix_caching=True, mamba_ssm_cache_dtype="bfloat16", mamba_cache_dtype="float16"
    )
    flagged = resolve_plan_request(flags, config, 1024, None)
    assert flagged is not None
    assert (flagged.enable_prefix_caching, flagged.mamba_ssm_cache_dtype) == (True, "bfloat16")
    assert flagged.mamba_cache_dtype == "float16"
    unknown = resolve_plan_request(inputs, replace(config, mamba_ssm_cache_dtype="auto"), 1024, None)
    assert unknown is not None
    assert unknown.mamba_ssm_cache_dtype == "auto"


def test_planning_needs_a_model_and_a_gpu_size() -> None:
    assert resolve_plan_request(PlanInputs(), None, None, 24 * GIB) is None
    assert resolve_plan_request(PlanInputs(architecture=TINY), None, None, None) is None
    from_nvml = resolve_plan_request(PlanInputs(architecture=TINY), None, None, 24 * GIB)
    assert from_nvml is not None
    assert (from_nvml.gpu, from_nvml.gpu_memory_bytes) == ("nvml", 24 * GIB)
    a100 = resolve_plan_request(
        PlanInputs(architecture=TINY), None, None, 80 * GIB, gpu_name="NVIDIA A100-SXM4-80GB"
    )
    assert a100 is not None
    assert a100.gpu == "NVIDIA A100-SXM4-80GB"
    assert a100.effective_batch == (
        2048,
        256,
    )  # vLLM excludes A100s from the >= 70 GiB defaults by device name


def _diagnose(
    ledger=None, snapshot=None, *, up=True, settings=None, gpus=(), history=None, now=0.0, mml=1024
):  # type: ignore[no-untyped-def]
    settings = settings or MonitorSettings()
    comparison = compare(ledger, snapshot, max_model_len=mml, settings=settings)
    found = diagnose(
        comparison=comparison,
        engine_up=up,
        snapshot=snapshot,
        predicted=ledger is not None,
        gpus=list(gpus),
        history=history or SignalHistory(600),
        now=now,
        settings=settings,
    )
    return {d.id: d.severity for d in found}


def _tiny_ledger(**changes):  # type: ignore[no-untyped-def]
    request = PlanRequest(TINY, 24 * GIB, max_model_len=1024, block_size=128, num_gpu_blocks_override=16)
    return build_ledger(replace(request, **changes))


@pytest.mark.parametrize(
    ("predicted_blocks", "expected"),
    [(16, None), (15, Severity.INFO), (13, Severity.WARNING), (12, Severity.WARNING)],
)
def test_pool_drift_thresholds(predicted_blocks: int, expected: Severity | None) -> None:
    # the engine has 16 blocks: 15 predicted is +6.7% (info), 13 is +23% and 12 is +33% (warning)
    found = _diagnose(_tiny_ledger(num_gpu_blocks_override=predicted_blocks), _snapshot())
    assert found.get("kv-pool-drift") == expected


def test_drift_exactly_at_twenty_percent_is_not_a_warning() -> None:
    ledger = _tiny_ledger(num_gpu_blocks_override=20)  # engine 16 = -20% exactly
    assert _diagnose(ledger, _snapshot()).get("kv-pool-drift") is Severity.INFO


@pytest.mark.parametrize(("version", "names_it"), [("0.29.0", True), ("0.31.0", False), ("0.26.0", False)])
def test_a_smaller_pool_on_a_release_that_counts_pinned_segments_names_the_cause(
    version: str, names_it: bool
) -> None:
    ledger = _tiny_ledger(num_gpu_blocks_override=24, vllm_version=version)  # the engine has 16: -33%
    drift = _pool_drift(ledger)
    assert drift.severity is Severity.WARNING
    assert ("freed during its start-up profile" in drift.advice) is names_it
    assert (
        compare(ledger, _snapshot(), max_model_len=1024, settings=MonitorSettings()).vllm_release == version
    )


@pytest.mark.parametrize(
    ("eager", "predicted_blocks", "names_it"), [(False, 24, True), (True, 24, False), (False, 12, False)]
)
def test_a_smaller_pool_names_a_cold_compile_cache_unless_vllm_runs_eager(
    eager: bool, predicted_blocks: int, names_it: bool
) -> None:
    # vLLM compiles in its start-up profile and charges a cold compile's temporaries to it (issues #54122,
    # #54383): only a pool smaller than planned (24 blocks planned, 16 in the engine), only when not eager
    ledger = _tiny_ledger(num_gpu_blocks_override=predicted_blocks, enforce_eager=eager)
    assert ("empty torch.compile cache" in _pool_drift(ledger).advice) is names_it


def _pool_drift(ledger):  # type: ignore[no-untyped-def]
    """The kv-pool-drift diagnosis of ``ledger`` against the engine's page (16 blocks)."""
    settings = MonitorSettings()
    found = diagnose(
        comparison=compare(ledger, _snapshot(), max_model_len=1024, settings=settings), engine_up=True,
        snapshot=_snapshot(), predicted=True, gpus=[], history=SignalHistory(600), now=0.0, settings=settings,
    )  # fmt: skip
    return next(d for d in found if d.id == "kv-pool-drift")


def test_fp8_requested_but_engine_reports_auto() -> None:
    settings = MonitorSettings(requested_kv_dtype="fp8", model_dtype="bf16")
    assert (
        _diagnose(_tiny_ledger(), _snapshot("auto"), settings=settings)["kv-dtype-not-in-effect"]
        is Severity.WARNING
    )
    assert "kv-dtype-not-in-effect" not in _diagnose(_tiny_ledger(), _snapshot("fp8_e4m3"), settings=settings)
    bf16 = MonitorSettings(requested_kv_dtype="bf16", model_dtype="bf16")
    assert "kv-dtype-not-in-effect" not in _diagnose(_tiny_ledger(), _snapshot("auto"), settings=bf16)


@pytest.mark.parametrize(("target", "expected"), [(1, None), (2, None), (3, Severity.WARNING)])
def test_max_concurrency_against_the_target(target: int, expected: Severity | None) -> None:
    found = _diagnose(_tiny_ledger(), _snapshot(), settings=MonitorSettings(target_concurrency=target))
    assert found.get("max-concurrency-below-target") == expected  # the engine holds exactly 2.00x


def test_max_concurrency_below_one_is_critical() -> None:
    # an engine page without kv_cache_max_concurrency: 2048 pool tokens < one 4096-token request
    text = substitute_label(page(PRESSURE_PAGE), "vllm:cache_config_info", "kv_cache_max_concurrency", "None")
    ledger = _tiny_ledger(max_model_len=4096, allow_long_max_model_len=True)  # the tiny model derives 1024
    found = _diagnose(ledger, parse_vllm_metrics(text), mml=4096)
    assert found["max-concurrency-below-one"] is Severity.CRITICAL


def test_engine_down_and_missing_prediction() -> None:
    found = _diagnose(None, None, up=False)
    assert found == {"engine-down": Severity.CRITICAL, "no-prediction": Severity.INFO}


def test_renamed_metric() -> None:
    snap = parse_vllm_metrics(page(PRESSURE_PAGE).replace("vllm:kv_cache_usage_perc", "vllm:kv_usage_x"))
    assert _diagnose(None, snap)["engine-metrics-missing"] is Severity.WARNING


def test_sustained_load_diagnoses() -> None:
    history = history_of((0, 0.9, 3, 1), (30, 0.95, 2, 1), (60, 0.9, 1, 2))
    found = _diagnose(None, _snapshot(), history=history, now=60)
    assert found["kv-usage-high-sustained"] is Severity.WARNING
    assert found["requests-waiting-sustained"] is Severity.WARNING
    assert found["preemptions-increasing"] is Severity.WARNING
    calm = history_of((0, 0.9, 3, 1), (30, 0.5, 0, 1), (60, 0.9, 1, 1))
    assert not {"kv-usage-high-sustained", "requests-waiting-sustained", "preemptions-increasing"} & set(
        _diagnose(None, _snapshot(), history=calm, now=60)
    )


def test_gpu_memory_above_the_engines_reservation() -> None:
    total = 24 * GIB
    reservation = int(total * 0.92)  # the page says gpu_memory_utilization 0.92
    ok = GpuSnapshot(0, "gpu", total, reservation + int(0.02 * total), total - reservation)
    over = replace(
        ok, used_bytes=reservation + int(0.02 * total) + 2, processes=(GpuProcess(1, 5), GpuProcess(2, 6))
    )
    assert "gpu-memory-above-reservation" not in _diagnose(None, _snapshot(), gpus=[ok])
    assert _diagnose(None, _snapshot(), gpus=[over])["gpu-memory-above-reservation"] is Severity.WARNING


def test_gpu_peak_near_total() -> None:
    total = 100 * GIB
    history = SignalHistory(600)
    for t, used in enumerate([80, 80, 96]):
        history.add(Observation(at=float(t), gpu_used_bytes=used * GIB))
    gpu = GpuSnapshot(0, "gpu", total, 80 * GIB, 20 * GIB)
    assert (
        _diagnose(None, None, gpus=[gpu], history=history)["gpu-memory-peak-near-total"] is Severity.WARNING
    )


def test_diagnoses_are_ordered_most_severe_first() -> None:
    settings = MonitorSettings(requested_kv_dtype="fp8", model_dtype="bf16")
    comparison = compare(_tiny_ledger(), _snapshot(), max_model_len=4096, settings=settings)
    found = diagnose(
        comparison=comparison,
        engine_up=False,
        snapshot=_snapshot(),
        predicted=True,
        gpus=[],
        history=SignalHistory(10),
        now=0,
        settings=settings,
    )
    ranks = [d.severity.rank for d in found]
    assert ranks == sorted(ranks, reverse=True)
    assert resolve_model("qwen2.5-7b")  # catalog still importable alongside the monitor


@pytest.mark.parametrize(
    ("predicted", "error", "active"), [(True, "offline", True), (True, None, False), (False, "x", False)]
)
def test_a_drafter_left_out_of_the_prediction_is_a_warning(
    predicted: bool, error: str | None, active: bool
) -> None:
    settings = MonitorSettings()
    ledger = _tiny_ledger() if predicted else None
    found = diagnose(
        comparison=compare(ledger, _snapshot(), max_model_len=1024, settings=settings), engine_up=True,
        snapshot=_snapshot(), predicted=predicted, gpus=[], history=SignalHistory(600), now=0.0,
        settings=settings, drafter_error=error,
    )  # fmt: skip
    drafter = [d for d in found if d.id == "drafter-unresolved"]
    assert bool(drafter) is active
    if drafter:
        assert drafter[0].severity is Severity.WARNING
        assert drafter[0].message.endswith(": offline")


def test_a_smaller_pool_for_a_model_the_plan_leaves_partly_out_names_what_it_leaves_out() -> None:
    """A hybrid whose state layers are not modelled (Kimi Linear): the pool is smaller than planned, and says why."""
    kimi = architecture_from_config(
        TINY_CONFIG | {"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
                       "linear_attn_config": {"kda_layers": list(range(2, TINY_CONFIG["num_hidden_layers"] + 1))}}
    )  # fmt: skip
    for arch, names_it in ((kimi, True), (TINY, False)):
        drift = _pool_drift(_tiny_ledger(architecture=arch, num_gpu_blocks_override=24))  # engine 16: -33%
        assert (
            "the plan does not model KimiLinearForCausalLM's recurrent-state layers" in drift.advice
        ) is names_it


def test_an_engine_started_with_a_packed_kv_format_is_planned_in_it() -> None:
    """vLLM's cache_dtype label names the format: before, it was dropped and the pool planned at bf16."""
    config = _snapshot("int8_per_token_head").cache_config
    request = resolve_plan_request(
        PlanInputs(architecture=TINY, gpu_memory_bytes=24 * GIB, block_size=16), config, 1024, None
    )
    assert request is not None
    assert request.kv_cache_dtype == "int8_per_token_head"
    plain = build_ledger(replace(request, kv_cache_dtype="auto")).kv_bytes_per_token
    assert build_ledger(request).kv_bytes_per_token < plain


def test_a_0_34_engine_that_leaves_the_utilisation_unset_is_planned_at_the_whole_device() -> None:
    """0.34's cache_config_info reads gpu_memory_utilization="None" unless set: its extensible cache takes 1.0."""
    page_034 = substitute_label(
        page(PRESSURE_PAGE), "vllm:cache_config_info", "gpu_memory_utilization", "None"
    )
    for label in ("kv_cache_memory_bytes", "num_gpu_blocks_override"):  # a GPU engine that sizes its own pool
        page_034 = substitute_label(page_034, "vllm:cache_config_info", label, "None")
    config = parse_vllm_metrics(page_034).cache_config
    assert config is not None
    assert config.gpu_memory_utilization is None
    inputs = PlanInputs(architecture=TINY, gpu_memory_bytes=24 * GIB)
    request = resolve_plan_request(inputs, config, 1024, 24 * GIB, engine_version="0.34.0")
    assert request is not None
    assert request.effective_gpu_memory_utilization == 1.0
    older = resolve_plan_request(inputs, config, 1024, 24 * GIB, engine_version="0.32.0")
    assert older is not None
    assert older.effective_gpu_memory_utilization == 0.92
