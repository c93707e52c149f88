"""The planner's LoRA slot memory equals, to the byte, what vLLM allocates when it loads a model with LoRA.

Each case builds a tiny random model of one family (dense with and without embedding slots, QKV and gate-up
fused on disk, two MoE layouts with a router and shared experts, DeepSeek's MLA with a dense first layer), loads
it in vLLM 0.32 in-process with ``enable_lora`` (``lora_slots_probe.py``) and sums every LoRA buffer of the
loaded model. Before ``sidecar/budget/lora.py`` the planner had no LoRA term at all (0 bytes). Five families are
loaded again with ``--lora-target-modules`` (``lora_target_modules``): a part naming its packed layer, a
packing the class declares, one vLLM infers or adds at run time, embeddings only when listed; before
2026-12-06 the plan counted every layer's slots whatever the list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import load_architecture
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.lora import LoraSlots, lora_slot_bytes
from sidecar.units import GIB
from tests.harness.vllm import run_probe, tagged_records

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("lora_slots_probe.py")
CASES = [  # (case, family, max_loras, max_lora_rank, --lora-target-modules)
    ("qwen2", "qwen2", 3, 16, ()),  # the suite's tiny model: no embedding slots (Qwen2ForCausalLM lists none)
    ("llama", "llama", 2, 8, ()),  # embedding and LM head slots
    ("phi3", "phi3", 2, 16, ()),  # QKV and gate-up fused on disk: one A slice each
    ("olmo", "olmo", 1, 8, ()),  # packed projections inferred from the model's children
    ("mixtral", "mixtral", 2, 8, ()),  # routed experts and the router
    ("qwen2moe", "qwen2moe", 3, 8, ()),  # experts, a shared expert and its gate
    ("deepseek", "deepseek", 2, 32, ()),  # MLA projections, a dense first layer, a shared expert
    # --lora-target-modules (vLLM 0.20 on): a part names its packed layer; embeddings only when listed
    ("llama-targets", "llama", 2, 8, ("q_proj", "down_proj")),
    ("phi3-targets", "phi3", 2, 16, ("qkv_proj", "lm_head")),
    ("olmo-targets", "olmo", 1, 8, ("k_proj", "gate_proj")),  # packing inferred, as vLLM infers it
    (
        "qwen2moe-targets",
        "qwen2moe",
        3,
        8,
        ("gate_proj", "experts", "shared_expert_gate"),
    ),  # no gate-up packing
    ("deepseek-targets", "deepseek", 2, 32, ("q_a_proj", "kv_b_proj", "gate")),  # the run-time fused q_a/kv_a
]


@pytest.fixture(scope="module")
def measured(
    vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Every case's model and what vLLM allocated for it, from one vLLM process."""
    root = tmp_path_factory.mktemp("lora-models")
    families = sorted({family for _, family, *_ in CASES if family != "qwen2"})
    run_probe(vllm_env, PROBE, "make", str(tiny_model), str(root), *families)
    models = {family: tiny_model if family == "qwen2" else root / family for _, family, *_ in CASES}
    specs = [
        f"{models[family]}:{loras}:{rank}" + (f"@{'+'.join(targets)}" if targets else "")
        for _, family, loras, rank, targets in CASES
    ]
    records = tagged_records(run_probe(vllm_env, PROBE, "measure", *specs), "LORA-SLOTS")
    return {case: (models[family], record) for (case, family, *_), record in zip(CASES, records, strict=True)}


@pytest.mark.parametrize(("case", "family", "max_loras", "rank", "targets"), CASES, ids=[c[0] for c in CASES])
def test_slot_bytes_equal_what_vllm_allocates(
    measured: dict[str, tuple[Path, dict[str, Any]]],
    case: str,
    family: str,
    max_loras: int,
    rank: int,
    targets: tuple[str, ...],
) -> None:
    model, record = measured[case]
    slots = LoraSlots(max_loras=max_loras, max_lora_rank=rank, target_modules=frozenset(targets) or None)
    request = PlanRequest(
        architecture=load_architecture(model), gpu_memory_bytes=24 * GIB, max_model_len=512, lora=slots
    )
    assert record["total"] > 0, family
    assert lora_slot_bytes(request, slots) == record["total"], record["buffers"]
    assert build_ledger(request).profile["lora"] == record["total"]
