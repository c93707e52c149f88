"""DeepSeek-V4.1's pool as vLLM 0.32's own packing code gives it, against the plan's.

vLLM's CPU server cannot build DeepSeek-V4.1 (its attention asserts a CUDA device), so
``deepseek_v41_probe.py`` (run with vLLM's python) builds the cache specs vLLM 0.32.0's V4.1 layers register
and packs them with vLLM's ``_get_packed_kv_cache_groups``. The plan's groups (block and page), the bytes a
block id costs and the blocks a full-length request holds must be vLLM's, on the published DeepSeek-V4.1-Flash
config, for the Hopper record and the Blackwell mega-attention one with seven speculative tokens. Before, the
plan read the model as a generic MLA one and said its caches were not modelled.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sidecar.budget import architecture_from_config
from sidecar.budget.deepseek_v4 import pack
from sidecar.budget.deepseek_v41 import v41_cache_layers, v41_record
from tests.harness.vllm import run_probe, tagged_records
from tests.unit.test_deepseek_v41 import FLASH

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("deepseek_v41_probe.py")


@pytest.mark.parametrize(("gpu", "drafts", "max_model_len"), [("h200", 0, 1_048_576), ("b200", 7, 131072)])
def test_vllms_packing_of_the_specs_is_the_plans(
    vllm_env: Path, tmp_path: Path, gpu: str, drafts: int, max_model_len: int
) -> None:
    attention = architecture_from_config(FLASH).v4
    assert attention is not None
    record = v41_record(attention, 64, gpu, 8)
    in_flight = 16384
    config = tmp_path / "config.json"
    config.write_text(json.dumps(FLASH))
    arguments = {
        "block": record.block, "window_bytes": record.window_bytes, "latent_bytes": record.latent_bytes,
        "alignment": record.alignment, "drafts": drafts, "max_model_len": max_model_len, "in_flight": in_flight,
    }  # fmt: skip
    (view,) = tagged_records(run_probe(vllm_env, PROBE, str(config), json.dumps(arguments)), "DEEPSEEK_V41")
    pool = pack(v41_cache_layers(attention, record, drafts))
    assert Counter((g.block, g.page) for g in pool.groups) == Counter(
        (g["block"], g["page"]) for g in view["groups"]
    )
    assert pool.stride == view["stride"]
    assert pool.blocks_per_request(max_model_len, in_flight) == view["request_blocks"]
