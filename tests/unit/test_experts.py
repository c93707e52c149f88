"""Data and expert parallelism: where the routed experts live, and what that does to weights and workspace.

The rules are vLLM 0.32.0's ``FusedMoEParallelConfig.make`` and ``determine_expert_map``
(:mod:`sidecar.budget.experts`); the calibration table's gpt-oss-20b rows at DP 4 and at TP 2 with expert
parallelism check them against real start-up logs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger
from sidecar.budget.experts import ExpertPlacement, expert_placement
from sidecar.budget.parameters import expert_parameter_count, parameter_count
from sidecar.budget.profile import loaded_weights_per_gpu, moe_workspace_bytes, rope_cache_bytes
from sidecar.errors import UsageError
from sidecar.units import GIB

CONFIGS = Path(__file__).parents[1] / "data" / "hf-configs"


def _request(config: str, **settings: object) -> PlanRequest:
    arch = architecture_from_config(json.loads((CONFIGS / config).read_text()))
    settings = {"gpu": "NVIDIA H100 80GB", "max_model_len": 8192, **settings}
    return PlanRequest(arch, 80 * GIB, **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("experts", "tp", "dp", "ep", "expected"),
    [
        (8, 1, 1, False, ExpertPlacement(1, 8, 1)),  # one GPU: everything
        (8, 2, 1, False, ExpertPlacement(2, 8, 1)),  # TP: a slice of every expert
        (32, 1, 4, False, ExpertPlacement(4, 32, 4)),  # DP: the slicing is flattened over DP x TP
        (32, 2, 2, False, ExpertPlacement(4, 32, 2)),
        (32, 2, 1, True, ExpertPlacement(1, 16, 1)),  # EP: whole experts, split evenly
        (8, 1, 3, True, ExpertPlacement(1, 3, 3)),  # 8 over 3: 3, 3, 2 (the first ranks take the remainder)
        (128, 2, 4, True, ExpertPlacement(1, 16, 4)),
        (8, 1, 1, True, ExpertPlacement(1, 8, 1)),  # EP on one GPU changes nothing
    ],
)
def test_expert_placement_follows_vllm(
    experts: int, tp: int, dp: int, ep: bool, expected: ExpertPlacement
) -> None:
    assert expert_placement(experts, tp, dp, expert_parallel=ep) == expected


def test_a_dense_model_is_not_changed_by_data_parallelism() -> None:
    one = _request("meta-llama--Llama-3.1-8B-Instruct.json")
    four = replace(one, data_parallel_size=4, enable_expert_parallel=True)
    assert one.experts is None
    assert build_ledger(four).profile == build_ledger(one).profile
    assert build_ledger(four).kv_pool_blocks == build_ledger(one).kv_pool_blocks


def test_data_parallel_engines_share_the_experts_not_the_attention() -> None:
    tp1 = _request("mistralai--Mixtral-8x7B-Instruct-v0.1.json")
    params = parameter_count(tp1.architecture)
    experts = expert_parameter_count(tp1.architecture)
    rest_bytes = (params - experts) * 2  # bf16
    dp2, tp2 = replace(tp1, data_parallel_size=2), replace(tp1, tensor_parallel_size=2)
    # the experts are halved either way; the attention and embeddings only by TP
    assert loaded_weights_per_gpu(dp2, params) - loaded_weights_per_gpu(tp2, params) == rest_bytes // 2
    assert loaded_weights_per_gpu(tp1, params) - loaded_weights_per_gpu(dp2, params) == experts * 2 // 2
    # each engine's KV per token is a whole engine's (TP 1), so DP leaves more pool than TP 1 alone
    assert build_ledger(dp2).kv_bytes_per_token == build_ledger(tp1).kv_bytes_per_token
    assert build_ledger(dp2).kv_pool_blocks > build_ledger(tp1).kv_pool_blocks


def test_expert_parallelism_holds_whole_experts() -> None:
    tp2 = _request("mistralai--Mixtral-8x7B-Instruct-v0.1.json", tensor_parallel_size=2)
    ep2 = replace(tp2, enable_expert_parallel=True)
    params = parameter_count(tp2.architecture)
    assert loaded_weights_per_gpu(ep2, params) == loaded_weights_per_gpu(tp2, params)  # 4 whole = 8 halves
    # the workspace is sized by the whole expert width: Triton's max(I, H) + max(2I, H) per token and expert
    tokens = tp2.effective_batch[0]
    hidden, width = 4096, 14336
    assert moe_workspace_bytes(ep2) == tokens * 2 * (max(width, hidden) + max(2 * width, hidden)) * 2
    half = width // 2
    assert moe_workspace_bytes(tp2) == tokens * 2 * (max(half, hidden) + max(2 * half, hidden)) * 2


def test_the_experts_see_every_data_parallel_rank_s_batch() -> None:
    one = _request("Qwen--Qwen3-30B-A3B.json")
    two = replace(one, data_parallel_size=2)
    tokens, hidden, width = one.effective_batch[0], 2048, 768
    per_token = 8 * (max(width, hidden) + max(2 * width, hidden)) * 2  # top-8, Triton experts, bf16
    assert moe_workspace_bytes(one) == tokens * per_token
    sliced = width // 2
    assert moe_workspace_bytes(two) == 2 * tokens * 8 * (max(sliced, hidden) + max(2 * sliced, hidden)) * 2


def test_gpt_oss_at_dp4_holds_a_quarter_of_the_padded_experts() -> None:
    dp4 = _request("openai--gpt-oss-20b.json", data_parallel_size=4, gpu="NVIDIA L4")
    # MXFP4 experts padded to Marlin's tiles: hidden 2880 -> 3072, a quarter of 2880 = 720 -> 768
    per_layer = 32 * 3 * 3072 * 768 * 0.53125  # 4.25 bits per parameter
    params = parameter_count(dp4.architecture)
    rest = (params - expert_parameter_count(dp4.architecture)) * 2
    assert loaded_weights_per_gpu(dp4, params) == rope_cache_bytes(dp4) + round(rest + per_layer * 24)


def test_data_parallel_size_must_be_positive() -> None:
    with pytest.raises(UsageError, match="--data-parallel-size"):
        _request("openai--gpt-oss-20b.json", data_parallel_size=0)
