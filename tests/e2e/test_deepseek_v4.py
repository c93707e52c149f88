"""DeepSeek-V4 on the real engine: vLLM 0.32 packs its caches into the groups, pages and blocks the plan has.

vLLM 0.32's CPU server (1 GiB of KV, ``max_model_len`` 4096, 1,024 tokens a step) loads the tiny configs of
``deepseek_v4_probe.py`` with random weights. Each KV cache group's block size and page bytes must be one of
the plan's :class:`~sidecar.budget.deepseek_v4.PackedGroup`, the pool's blocks 1 GiB over the largest page,
and the maximum concurrency those blocks over the blocks a 4,096-token request holds in every group at the
engine's in-flight tokens. Before, the plan read DeepSeek-V4 as one 512-wide KV head of keys and values per
layer, 2,048 bytes a token at bf16 in each, and packed no pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import load_architecture
from sidecar.budget.deepseek_v4 import v4_pool
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.units import GIB
from tests.harness.vllm import made_and_measured

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("deepseek_v4_probe.py")
LAYOUTS = ["flash", "flash6"]


@pytest.fixture(scope="module")
def engine(vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The configs' folder and what vLLM built and held for each."""
    return made_and_measured(vllm_env, PROBE, "DEEPSEEK_V4", tiny_model, tmp_path_factory.mktemp("v4"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_groups_are_the_plans(engine: tuple[Path, Any], layout: str) -> None:
    root, runs = engine
    arch = load_architecture(root / layout)
    assert arch.v4 is not None
    pool = v4_pool(arch.v4, "auto")
    engine_groups = sorted((g["block_size"], g["page"]) for g in runs[layout]["groups"])
    assert engine_groups == sorted((g.block, g.page) for g in pool.groups)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_pool_and_the_concurrency_are_the_engines(engine: tuple[Path, Any], layout: str) -> None:
    root, runs = engine
    run = runs[layout]
    # One step in flight (the CPU platform turns async scheduling off) of the probe's 1,024 tokens, or, on a
    # CPU without AMX tiles, of max(max_model_len, 2048): vLLM's CPU platform then turns chunked prefill off
    # for MLA models and raises the batch (``CpuPlatform.check_and_update_config``, 0.32.0)
    batch = run["in_flight"]
    assert batch in {1024, 4096}
    request = PlanRequest(
        architecture=load_architecture(root / layout), gpu_memory_bytes=24 * GIB, max_model_len=4096,
        kv_cache_memory_bytes=GIB, max_num_batched_tokens=batch, async_scheduling=False,
    )  # fmt: skip
    ledger = build_ledger(request)
    assert ledger.kv_pool_blocks == run["num_blocks"]
    assert ledger.max_concurrency == round(run["max_concurrency"], 2)
