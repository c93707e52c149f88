"""Which GPU model runner vLLM picks per release, and the batches in flight it makes a sliding layer count.

The rules are ``VllmConfig.use_v2_model_runner`` and ``max_concurrent_batches`` (``vllm/config/vllm.py``),
read in the release wheels 0.21.0-0.34.0 (sources in :mod:`sidecar.budget.model_runner`).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from sidecar.budget.architecture import Architecture, architecture_from_config
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.model_runner import ModelRunner, batches_in_flight, default_model_runner
from sidecar.budget.vllm_release import VllmRelease
from sidecar.cli import main
from sidecar.units import GIB

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf-configs"
V1, V2 = ModelRunner.V1, ModelRunner.V2


@cache
def model(name: str) -> Architecture:
    return architecture_from_config(json.loads((CONFIGS / f"{name}.json").read_text()))


LLAMA, QWEN3 = "meta-llama--Llama-3.1-8B-Instruct", "Qwen--Qwen3-8B"
QWEN2, QWEN3_FP8 = "Qwen--Qwen2.5-7B-Instruct", "Qwen--Qwen3-32B-FP8"
MIXTRAL, GPT_OSS = "mistralai--Mixtral-8x7B-Instruct-v0.1", "openai--gpt-oss-20b"
QWEN3_NEXT = "Qwen--Qwen3-Next-80B-A3B-Thinking"  # MoE with linear-attention (state) layers: vLLM's is_hybrid


@pytest.mark.parametrize(
    ("release", "name", "method", "runner"),
    [
        ("0.21.0", QWEN3, None, V1),  # VLLM_USE_V2_MODEL_RUNNER defaults to false
        ("0.22.0", QWEN3, None, V2),  # the one listed class
        ("0.22.0", LLAMA, None, V1),
        ("0.22.0", QWEN3_FP8, None, V1),  # listed, but quantised
        ("0.23.0", LLAMA, None, V2),
        ("0.23.0", QWEN2, None, V1),
        ("0.24.0", QWEN3_FP8, None, V2),  # 0.24 drops the dense-and-unquantised condition
        ("0.24.0", QWEN2, None, V1),
        ("0.25.0", QWEN2, None, V2),  # every dense model without state layers
        ("0.25.0", MIXTRAL, None, V1),  # a MoE class not on the list
        ("0.28.0", GPT_OSS, None, V1),
        ("0.28.0", QWEN3_NEXT, None, V1),
        ("0.29.0", GPT_OSS, None, V2),  # every generating model
        ("0.29.0", QWEN3_NEXT, None, V2),
        ("0.29.0", LLAMA, "ngram", V1),  # a method V2 lacks sends the engine back to V1
        ("0.29.0", LLAMA, "eagle3", V2),
        ("0.30.0", LLAMA, "draft_model", V1),
        ("0.31.0", LLAMA, "draft_model", V2),
        ("0.31.0", LLAMA, "ngram", V1),
        ("0.32.0", LLAMA, "ngram", V2),
        ("0.32.0", LLAMA, "suffix", V1),
        ("0.33.0", LLAMA, "medusa", V2),
        ("0.33.0", LLAMA, "suffix", V1),
        ("0.34.0", LLAMA, "suffix", V2),  # V1's runner is gone from 0.34's wheel
        ("0.29.0", LLAMA, "deepseek_mtp", V2),  # the older spelling of mtp
    ],
)
def test_the_release_picks_the_runner_its_config_code_picks(
    release: str, name: str, method: str | None, runner: ModelRunner
) -> None:
    assert default_model_runner(VllmRelease.parse(release), model(name), method) is runner


@pytest.mark.parametrize(
    ("release", "runner", "stages", "overlap", "batches"),
    [
        ("0.25.0", V2, 2, True, 1),  # before 0.26 the cap adds max_num_batched_tokens once
        ("0.26.0", V1, 1, True, 2),
        ("0.26.0", V2, 1, True, 2),
        ("0.32.0", V2, 2, True, 3),  # V2 overlaps pipeline stages: stages + 1
        ("0.32.0", V2, 4, True, 5),
        ("0.32.0", V1, 2, True, 2),  # V1 does not: the stages
        ("0.32.0", V1, 4, False, 4),
        ("0.32.0", V2, 1, False, 1),  # --no-async-scheduling, or the CPU platform
        ("0.34.0", V2, 2, True, 3),
    ],
)
def test_batches_in_flight_follow_max_concurrent_batches(
    release: str, runner: ModelRunner, stages: int, overlap: bool, batches: int
) -> None:
    got = batches_in_flight(
        VllmRelease.parse(release), runner, pipeline_stages=stages, async_scheduling=overlap
    )
    assert got == batches


def _sliding_request(**settings: object) -> PlanRequest:
    return PlanRequest(
        model("google--gemma-2-9b-it"), 48 * GIB, max_model_len=32768, allow_long_max_model_len=True,
        max_num_batched_tokens=2048, activation_bytes=0, non_torch_bytes=0, vllm_version="0.32.0",
        **settings,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_pipeline_on_the_v2_runner_widens_the_sliding_cap_by_a_batch_per_stage() -> None:
    # gemma-2-9b: 4,096-token window; cdiv(4095 + in flight, 16) + 1 blocks per request in a sliding group
    one_stage = build_ledger(_sliding_request())
    on_v2 = build_ledger(_sliding_request(pipeline_parallel_size=2))
    on_v1 = build_ledger(_sliding_request(pipeline_parallel_size=2, model_runner=V1))
    assert on_v2.request.effective_model_runner is V2  # 0.32 runs V2 for a dense model on CUDA
    assert one_stage.request.in_flight_tokens == 2 * 2048
    assert on_v2.request.in_flight_tokens == 3 * 2048
    assert on_v1.request.in_flight_tokens == 2 * 2048
    for ledger, in_flight in ((on_v2, 3 * 2048), (on_v1, 2 * 2048)):
        sliding_blocks = -(-(4095 + in_flight) // 16) + 1
        assert ledger.max_concurrency == round(ledger.kv_pool_blocks / (2048 + sliding_blocks), 2)


def planned_runner(capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main([*flags, "--format", "json"], environ={}) == 0
    runner: str = json.loads(capsys.readouterr().out)["inputs"]["model_runner"]
    return runner


def test_vllms_runner_variable_is_read_as_vllm_reads_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["plan", "--model", "llama-3.1-8b", "--gpu", "h100", "--vllm-version", "0.28.0"]
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    assert planned_runner(capsys, *flags) == "v2"  # dense Llama: V2 by default from 0.23
    for value, runner in (("0", "v1"), ("1", "v2")):  # envs.py: maybe_convert_bool, bool(int(value))
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", value)
        assert planned_runner(capsys, *flags) == runner
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "yes")
    assert main(flags, environ={}) == 2
    err = capsys.readouterr().err
    assert "VLLM_USE_V2_MODEL_RUNNER='yes'" in err
    assert len(err.strip().splitlines()) == 1
