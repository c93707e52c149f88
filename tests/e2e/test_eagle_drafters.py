"""EAGLE-3, EAGLE and draft-model drafters on the real engine: their KV blocks and weights are what the plan says.

vLLM 0.32 loads a tiny Llama with each drafter of ``eagle_probe.py`` in turn. The engine's KV cache takes the
drafter's attention layer into every block (one layer of the target's page for the EAGLE heads: 6,553 blocks
of 128 tokens in 1 GiB instead of 8,192; a page twice the target's layer for the draft model: 5,461), and
keeps as the drafter's own exactly the checkpoint tensors the plan counts: the EAGLE-3 head's layer, ``fc``,
norm, LM head and ``d2t`` (not ``t2d``, not embeddings), the EAGLE head's layer and ``fc`` (its embeddings
copy is the target's, so vLLM shares it), the draft model whole. Before ``sidecar/budget/drafters.py`` the
plan counted none of it and said "not modelled".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import load_architecture
from sidecar.budget.catalog import resolve_drafter
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.errors import UsageError
from sidecar.units import GIB
from tests.harness.checkpoint import tensor_bytes
from tests.harness.vllm import made_and_measured, run_probe

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("eagle_probe.py")
DRAFTERS = {
    "eagle3": ("eagle3", "eagle3"),
    "eagle": ("eagle", "eagle"),
    "draft_model": ("draft_model", "draft"),
}
NOT_KEPT = {"eagle3": ("t2d",), "eagle": ("embed_tokens",), "draft_model": ()}  # vLLM drops or shares these
STACKED = ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
           (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj"))  # fmt: skip


@pytest.fixture(scope="module")
def engine(vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The models' folder and what vLLM held without a drafter (``plain``) and with each."""
    return made_and_measured(vllm_env, PROBE, "DRAFTER", tiny_model, tmp_path_factory.mktemp("eagle"))


def _spec(root: Path, label: str) -> SpeculativeSettings | None:
    if label == "plain":
        return None
    method, folder = DRAFTERS[label]
    text = json.dumps({"method": method, "model": str(root / folder), "num_speculative_tokens": 2})
    return resolve_drafter(SpeculativeSettings.parse(text))


def _plan(root: Path, label: str, block_size: int, target: str = "target") -> PlanRequest:
    return PlanRequest(
        architecture=load_architecture(root / target), gpu_memory_bytes=24 * GIB, max_model_len=512,
        block_size=block_size, kv_cache_memory_bytes=GIB, speculative=_spec(root, label),
    )  # fmt: skip  # the CPU engine's 1 GiB (VLLM_CPU_KVCACHE_SPACE)


def _vllm_name(name: str) -> str:
    """A checkpoint tensor's parameter name in vLLM's drafter (the classes' weight mappers)."""
    name = name.replace("midlayer.", "layers.0.").replace("d2t", "draft_id_to_target_id")
    for old, new in STACKED:
        name = name.replace(old, new)
    return name if name.startswith(("model.", "lm_head", "draft_id_to_target_id")) else f"model.{name}"


@pytest.mark.parametrize("label", ["plain", *DRAFTERS])
def test_each_drafter_takes_kv_blocks_as_planned(engine: tuple[Path, Any], label: str) -> None:
    root, runs = engine
    run = runs[label]
    layers = sum(len(group) for group in run["groups"])
    assert layers == (4 if label == "plain" else 5)
    assert len(run["groups"]) == 1  # the draft model's larger page joins the same group: one block, summed
    assert build_ledger(_plan(root, label, run["block_size"])).kv_pool_blocks == run["num_blocks"]


@pytest.mark.parametrize("label", list(DRAFTERS))
def test_each_drafter_keeps_the_tensors_the_plan_counts(engine: tuple[Path, Any], label: str) -> None:
    root, runs = engine
    tensors = tensor_bytes(root / DRAFTERS[label][1])
    kept = {name: size for name, size in tensors.items() if not any(part in name for part in NOT_KEPT[label])}
    assert {_vllm_name(name) for name in kept} == set(runs[label]["drafter_own"])
    planned = build_ledger(_plan(root, label, runs[label]["block_size"])).profile["drafter"]
    assert planned == sum(kept.values())


def test_vllm_and_the_plan_refuse_an_eagle3_head_on_a_class_that_cannot_feed_it(
    vllm_env: Path, engine: tuple[Path, Any]
) -> None:
    root, _ = engine
    lines = run_probe(vllm_env, PROBE, "refused", str(root)).splitlines()
    answers = [json.loads(x.removeprefix("REFUSED ")) for x in lines if x.startswith("REFUSED ")]
    assert answers, lines[-5:]  # the engine did not start
    assert "does not support EAGLE3" in answers[0]["error"]
    with pytest.raises(UsageError, match=r"^vLLM refuses an EAGLE-3 drafter for MixtralForCausalLM"):
        _plan(root, "eagle3", 16, target="mixtral")
