"""Pipeline-parallel planning at its boundaries: vLLM's layer split, the stage that sets the pool, the inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger
from sidecar.budget.pipeline import stage_layer_counts
from sidecar.errors import UsageError
from sidecar.units import GIB

CONFIGS = Path(__file__).parents[1] / "data" / "hf-configs"


@pytest.mark.parametrize(
    ("layers", "stages", "expected"),
    [  # each row as vLLM 0.32.0's get_pp_indices splits it (checked with vLLM's own function)
        (32, 1, (32,)),
        (32, 2, (16, 16)),
        (32, 4, (8, 8, 8, 8)),
        (30, 4, (7, 8, 8, 7)),  # the remainder goes to the stages before the last, backwards
        (80, 3, (27, 27, 26)),
        (61, 4, (15, 15, 16, 15)),
        (7, 3, (2, 3, 2)),
        (5, 5, (1, 1, 1, 1, 1)),
    ],
)
def test_stage_layer_counts_split_as_vllm_does(layers: int, stages: int, expected: tuple[int, ...]) -> None:
    assert stage_layer_counts(layers, stages) == expected


def llama_8b(**changes: object) -> PlanRequest:
    arch = architecture_from_config(
        json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.json").read_text())
    )
    settings: dict[str, object] = {
        "max_model_len": 8192, "gpu_memory_utilization": 0.95, "vllm_version": "0.19.0",
        "max_num_batched_tokens": 8192, "max_num_seqs": 1024, "gpu": "NVIDIA H100 80GB",
    }  # fmt: skip
    return PlanRequest(arch, round(79.19 * GIB), **{**settings, **changes})  # type: ignore[arg-type]


def test_the_last_stage_sets_the_pool_and_each_stage_holds_its_share() -> None:
    whole, halves = build_ledger(llama_8b()), build_ledger(llama_8b(pipeline_parallel_size=2))
    first, last = halves.stages
    assert (first.layers, last.layers) == (16, 16)
    assert last.activation > first.activation  # the sampler runs on the last stage only
    assert halves.kv_pool_blocks == last.pool_blocks < first.pool_blocks
    assert halves.profile["weights"] == last.weights < whole.profile["weights"]
    assert halves.kv_bytes_per_token * 2 == whole.kv_bytes_per_token  # a block holds the stage's layers
    assert halves.kv_pool_blocks == pytest.approx(67_207, rel=0.003)  # the llm-d row's logged pool
    assert "stage 2 (16 layers and the LM head and the sampler) sets the pool" in halves.notes[0]


def test_a_model_too_large_for_one_gpu_is_planned_per_stage() -> None:
    # Qwen3-32B's 61 GiB of weights do not fit one 40.47 GiB budget, which is why it runs on two stages: the
    # plan must size each stage's pool, not the whole model's (it said "does not fit", 0 tokens). A real boot
    # (vLLM 0.27.1, two RTX PRO 6000 at gpu_memory_utilization 0.426, FINDINGS.md) logs 56,640 tokens.
    arch = architecture_from_config(json.loads((CONFIGS / "Qwen--Qwen3-32B.json").read_text()))
    request = PlanRequest(
        arch, round(95.01 * GIB), gpu="NVIDIA RTX PRO 6000 Blackwell Server Edition", max_model_len=32768,
        gpu_memory_utilization=0.426, vllm_version="0.27.1", pipeline_parallel_size=2,
    )  # fmt: skip
    ledger = build_ledger(request)
    assert len(ledger.stages) == 2
    assert ledger.profile["weights"] < request.gpu_memory_bytes * 0.426  # a stage's half, not the model
    assert ledger.kv_pool_tokens == pytest.approx(56_640, rel=0.06)


def test_one_stage_is_the_unchanged_plan() -> None:
    ledger = build_ledger(llama_8b(pipeline_parallel_size=1))
    assert ledger.stages == ()
    assert ledger == build_ledger(llama_8b())


def test_more_stages_than_layers_is_one_line() -> None:
    with pytest.raises(UsageError, match="leaves a stage without layers: the model has 32"):
        llama_8b(pipeline_parallel_size=33)


def test_plan_json_lists_the_stages() -> None:
    from sidecar.budget.report import ledger_to_dict  # noqa: PLC0415 - only this test renders

    document = ledger_to_dict(build_ledger(llama_8b(pipeline_parallel_size=2)), [])
    assert [stage["layers"] for stage in document["pipeline_stages"]] == [16, 16]
    assert document["inputs"]["pipeline_parallel_size"] == 2
    assert document["kv_pool_blocks"] == document["pipeline_stages"][1]["kv_pool_blocks"]
