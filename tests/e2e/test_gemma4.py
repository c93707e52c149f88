"""Gemma 4 on the real engine: vLLM 0.32 sizes each tiny model's pool as the plan does.

vLLM 0.32 (CPU, 1 GiB of KV, ``max_model_len`` 512) loads the tiny Gemma 4 text models of
``gemma4_probe.py``. Their full-attention layers have a head size and KV heads of their own
(``global_head_dim``, ``num_global_key_value_heads``), so the full and sliding pages differ and vLLM raises
the smaller page's block (``unify_kv_cache_spec_page_size``); KV-shared layers draw nothing from the pool.
Before, the plan gave every layer the sliding geometry and counted the KV-shared layers: 1,365 sequences
planned where vLLM reports 862 for ``plain``, 2,048 where it reports 862 for ``shared``. The window of 64
plus the batch in flight spans the 512-token request, where vLLM plans one block more than the sequence
holds in each sliding group (the plan had capped it at the sequence's own).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.admission.geometry import engine_blocks_per_request, resolve_layout
from sidecar.budget import load_architecture
from sidecar.budget.architecture import architecture_from_config
from sidecar.budget.kv_groups import kv_groups, sliding_window_blocks
from sidecar.budget.kv_terms import kv_pages, layer_kv_bytes_per_token
from sidecar.budget.layer_kinds import LayerKind
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.parameters import computed_parameter_count
from sidecar.units import GIB
from tests.harness.checkpoint import tensor_bytes
from tests.harness.vllm import layer_index, made_and_measured

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("gemma4_probe.py")
MODELS = ["plain", "keys-are-values", "small-full", "shared", "moe"]


@pytest.fixture(scope="module")
def engine(vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The models' folder and what vLLM held for each."""
    return made_and_measured(vllm_env, PROBE, "GEMMA4", tiny_model, tmp_path_factory.mktemp("gemma4"))


def _plan(folder: Path) -> PlanRequest:
    return PlanRequest(
        architecture=load_architecture(folder), gpu_memory_bytes=24 * GIB, max_model_len=512, block_size=128,
        kv_cache_memory_bytes=GIB, async_scheduling=False,
    )  # fmt: skip  # the CPU engine's 128-token blocks and 1 GiB (VLLM_CPU_KVCACHE_SPACE)


@pytest.mark.parametrize("model", MODELS)
def test_the_pool_is_planned_as_the_engine_sizes_it(engine: tuple[Path, Any], model: str) -> None:
    root, runs = engine
    run, request = runs[model], _plan(root / model)
    ledger = build_ledger(request)
    kinds = request.architecture.kv_kinds
    groups, pages = kv_groups(kinds), kv_pages(request, kinds, layer_kv_bytes_per_token(request), 128)
    assert (groups.full + groups.sliding, ledger.block_size) == (len(run["groups"]), run["block_size"])
    for group in run["groups"]:  # each group's block: 128 tokens, or more where its page was the smaller
        kind = request.architecture.layer_kinds[layer_index(group["layers"][0])]
        assert group["block_size"] == pages.blocks[kind], group
    assert ledger.kv_pool_blocks == run["num_blocks"]
    assert ledger.max_concurrency == round(run["max_concurrency"], 2)


@pytest.mark.parametrize("model", MODELS)
def test_the_parameters_are_transformers(engine: tuple[Path, Any], model: str) -> None:
    """From config.json alone, as saved and as published: every tensor but the layers' ``layer_scalar``
    buffers, which the checkpoint carries (one element each) and transformers does not count."""
    folder = engine[0] / model
    tensors = tensor_bytes(folder)
    parameters = sum(size for name, size in tensors.items() if not name.endswith("layer_scalar")) // 2  # bf16
    for file in ("config.json", "published.json"):
        arch = architecture_from_config(json.loads((folder / file).read_text()))
        assert computed_parameter_count(arch) == parameters, file


@pytest.mark.parametrize("model", MODELS)
def test_admission_reads_the_same_layout_from_the_engine_and_from_the_model(
    engine: tuple[Path, Any], model: str
) -> None:
    root, runs = engine
    run, request = runs[model], _plan(root / model)
    kinds = request.architecture.kv_kinds
    groups, blocks = kv_groups(kinds), kv_pages(request, kinds, layer_kv_bytes_per_token(request), 128).blocks
    shape = (groups.full, groups.sliding, groups.chunked)
    group_blocks = (blocks[LayerKind.FULL], blocks[LayerKind.SLIDING])
    engine_blocks = engine_blocks_per_request(run["num_blocks"], run["max_concurrency"])
    from_engine = resolve_layout(
        block_size=128,
        max_model_len=512,
        engine_blocks=engine_blocks,
        groups=shape,
        group_blocks=group_blocks,
    ).layout
    window = sliding_window_blocks(64, request.in_flight_tokens, 512, group_blocks[1])
    predicted = resolve_layout(
        block_size=128, max_model_len=512, engine_blocks=None, groups=shape, group_blocks=group_blocks,
        predicted_window_cap=window,
    ).layout  # fmt: skip
    assert from_engine == predicted
    assert predicted is not None
    assert run["num_blocks"] / predicted.reserved_blocks(512, 128) == pytest.approx(run["max_concurrency"])
