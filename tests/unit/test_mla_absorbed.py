"""MLA's decode copies of ``kv_b_proj`` (``W_UK_T``, ``W_UV``) are counted with the weights vLLM loads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sidecar.budget.architecture import load_architecture
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.parameters import parameter_count
from sidecar.budget.profile import loaded_weights_per_gpu, mla_absorbed_bytes
from sidecar.units import GIB

CONFIGS = Path(__file__).parents[1] / "data" / "hf-configs"


def test_deepseek_v3_at_tp_8_holds_a_quarter_gib_more_per_gpu() -> None:
    arch = load_architecture(CONFIGS / "deepseek-ai--DeepSeek-V3.json")
    request = PlanRequest(
        architecture=arch, gpu_memory_bytes=141 * GIB, tensor_parallel_size=8, max_model_len=8192
    )
    # 61 layers x kv_lora_rank 512 x 16 heads per GPU x (128 nope + 128 v) x 2 bytes
    assert mla_absorbed_bytes(request) == 61 * 512 * 16 * 256 * 2
    plain = PlanRequest(
        architecture=load_architecture(CONFIGS / "Qwen--Qwen3-8B.json"), gpu_memory_bytes=24 * GIB
    )
    assert mla_absorbed_bytes(plain) == 0
    params = parameter_count(arch)
    without = replace(request, architecture=replace(arch, mla=None))  # the same parameters, no decode copies
    loaded = loaded_weights_per_gpu(request, params)
    assert loaded - loaded_weights_per_gpu(without, params) == mla_absorbed_bytes(request)
    assert build_ledger(request).profile["weights"] == loaded
