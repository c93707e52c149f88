"""An MTP drafter on the real engine: its KV layers and weights are what the plan budgets.

A tiny DeepSeek-V3 ships its multi-token-prediction layer beside the model, as the published checkpoints do
(``drafter_probe.py``). Loaded by vLLM 0.32 with ``{"method": "mtp"}``, the engine's KV cache holds that
layer too (three attention layers instead of two: 87,381 blocks of 16 tokens in 1 GiB instead of 131,072),
and the drafter's own weights are the checkpoint's MTP tensors less the embeddings and LM head it shares with
the model. Before ``sidecar/budget/speculative.py`` the plan counted neither, and counted the MTP tensors as
weights of the model itself. The same engine shows MLA's decode copies of ``kv_b_proj`` (``W_UV``,
``W_UK_T``), which the plan now counts with the loaded weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import load_architecture
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.profile import mla_absorbed_bytes
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.units import GIB
from tests.harness.checkpoint import tensor_bytes
from tests.harness.vllm import made_and_measured

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("drafter_probe.py")
MTP = '{"method": "mtp", "num_speculative_tokens": 1}'
SHARED = ("embed_tokens", "shared_head.head")  # the drafter's copies of the model's own: vLLM shares them


@pytest.fixture(scope="module")
def engine(vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The model directory and what vLLM held with the drafter (``mtp``) and without (``plain``)."""
    model = tmp_path_factory.mktemp("mtp") / "tiny-deepseek-v3"
    return made_and_measured(vllm_env, PROBE, "DRAFTER", tiny_model, model)


def _plan(model: Path, spec: SpeculativeSettings | None) -> PlanRequest:
    return PlanRequest(
        architecture=load_architecture(model), gpu_memory_bytes=24 * GIB, max_model_len=512, block_size=16,
        kv_cache_memory_bytes=GIB, speculative=spec,  # the CPU engine's 1 GiB (VLLM_CPU_KVCACHE_SPACE)
    )  # fmt: skip


def test_the_drafters_layer_takes_kv_blocks_as_planned(engine: tuple[Path, Any]) -> None:
    model, runs = engine
    assert len(runs["mtp"]["kv_layers"]) == len(runs["plain"]["kv_layers"]) + 1
    assert (
        build_ledger(_plan(model, SpeculativeSettings.parse(MTP))).kv_pool_blocks == runs["mtp"]["num_blocks"]
    )
    assert build_ledger(_plan(model, None)).kv_pool_blocks == runs["plain"]["num_blocks"]


def _checkpoint_mtp_bytes(model: Path) -> int:
    return sum(
        size
        for name, size in tensor_bytes(model).items()
        if name.startswith("model.layers.2.") and not any(part in name for part in SHARED)
    )


def test_the_drafters_weights_are_its_own_tensors(engine: tuple[Path, Any]) -> None:
    model, runs = engine
    own = runs["mtp"]["drafter_own"]
    assert own
    assert not [name for name in own if any(part in name for part in SHARED)]  # shared with the model
    architecture = load_architecture(model)
    assert architecture.draft_layers == 1
    planned = build_ledger(_plan(model, SpeculativeSettings.parse(MTP))).profile["drafter"]
    absorbed = (
        runs["plain"]["absorbed"] // architecture.num_layers
    )  # its own MLA decode copies (W_UV, W_UK_T)
    assert planned == pytest.approx(_checkpoint_mtp_bytes(model) + absorbed, rel=0.01)


def test_mla_keeps_decode_copies_of_kv_b_proj_as_planned(engine: tuple[Path, Any]) -> None:
    model, runs = engine
    assert runs["plain"]["absorbed"] > 0
    assert mla_absorbed_bytes(_plan(model, None)) == runs["plain"]["absorbed"]
