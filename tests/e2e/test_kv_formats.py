"""vLLM's packed KV formats as vLLM 0.32's own start-up code lays them out, against the plan's.

``kv_formats_probe.py`` (run with vLLM's python) builds the specs a GPU engine's layers register for each
format and groups them with vLLM's ``get_kv_cache_groups``; TurboQuant's boundary layers and raised block come
from vLLM's ``get_boundary_skip_layers`` and ``_align_heterogeneous_kv_block_size``. The plan's block, and the
bytes a block of every layer costs, must be vLLM's, on two catalog models (128-dimensional heads, 8 and 4 KV
heads). Before, the planner refused these spellings, and a ``run`` beside an engine started with one planned
its pool at the model's dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.budget import PlanRequest, build_ledger, resolve_model
from sidecar.budget.kv_formats import KV_FORMATS
from sidecar.units import GIB
from tests.harness.vllm import run_probe, tagged_records

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("kv_formats_probe.py")
MODELS = ("llama-3.1-8b", "qwen2.5-7b")


def test_vllms_pages_blocks_and_boundary_layers_are_the_plans(vllm_env: Path) -> None:
    cases = []
    for model in MODELS:
        arch = resolve_model(model)
        for name in KV_FORMATS:
            cases.append(
                {
                    "model": model,
                    "format": name,
                    "layers": arch.num_layers,
                    "kv_heads": arch.num_kv_heads,
                    "head": arch.head_dim,
                    "block": 16,
                }
            )
    views = tagged_records(run_probe(vllm_env, PROBE, json.dumps(cases)), "KV_FORMAT")
    assert len(views) == len(cases)
    for view in views:
        arch = resolve_model(view["model"])
        ledger = build_ledger(
            PlanRequest(architecture=arch, gpu_memory_bytes=80 * GIB, kv_cache_dtype=view["format"])
        )
        (group,) = view["groups"]  # every layer full attention: one group, each layer its own page
        assert group["layers"] == arch.num_layers
        assert ledger.block_size == view["block_out"] == group["block"], view
        assert ledger.kv_bytes_per_token * ledger.block_size == group["block_bytes"], view
        boundary = KV_FORMATS[view["format"]].boundary
        assert view["boundary"] == ([0, 1, arch.num_layers - 2, arch.num_layers - 1] if boundary else [])
