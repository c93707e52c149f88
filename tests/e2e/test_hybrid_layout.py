"""A hybrid model on the real vLLM server: one full-attention and one sliding-window layer, two KV cache groups.

vLLM 0.32.0 gives such a model two block tables drawn from one pool, so a request holds blocks in both, the
sliding one capped at its window (``tests/unit/test_kv_layout.py`` has the arithmetic). Planning one group,
as the sidecar did before, let two 830-token requests run together in 15 blocks that hold one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sidecar.admission.decide import AdmissionMode
from sidecar.admission.geometry import engine_blocks_per_request, resolve_layout
from sidecar.budget import load_architecture
from sidecar.budget.kv_groups import kv_groups, sliding_window_blocks
from sidecar.signals import parse_vllm_metrics
from tests.e2e.conftest import serve
from tests.e2e.spikes import admission_status, start_beside, straight_then_through
from tests.harness.spike import SpikeConfig
from tests.harness.vllm import VllmServer, make_tiny_model

pytestmark = pytest.mark.e2e

BATCHED_TOKENS = 256  # small enough that the window's cap (4 blocks) is below a full request's 8
GROWING = SpikeConfig(
    seed=11, long_requests=3, short_requests=0, long_prompt=130, long_output=700, spread_seconds=0.1
)


@pytest.fixture(scope="module")
def hybrid_model(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a Llama whose second layer has a 128-token window."""
    return make_tiny_model(vllm_env, tmp_path_factory.mktemp("hybrid") / "tiny-hybrid", hybrid=True)


@pytest.fixture(scope="module")
def hybrid_server(
    vllm_env: Path, hybrid_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """vLLM with 16 blocks of 128 tokens, max_model_len 1024, 256 tokens per batch."""
    yield from serve(
        vllm_env,
        hybrid_model,
        tmp_path_factory,
        "vllm-hybrid.log",
        ("--max-num-batched-tokens", str(BATCHED_TOKENS)),
    )


async def test_the_models_layers_predict_the_blocks_the_engine_counts_per_request(
    hybrid_server: VllmServer, hybrid_model: Path
) -> None:
    async with aiohttp.ClientSession() as session, session.get(hybrid_server.url + "/metrics") as response:
        config = parse_vllm_metrics(await response.text()).cache_config
    assert config is not None
    assert config.block_size == 128
    engine = engine_blocks_per_request(config.num_gpu_blocks, config.kv_cache_max_concurrency)
    groups = kv_groups(load_architecture(hybrid_model).layer_kinds)
    predicted = resolve_layout(
        block_size=128,
        max_model_len=1024,
        engine_blocks=None,  # from config.json and the flags alone
        groups=(groups.full, groups.sliding, groups.chunked),
        predicted_window_cap=sliding_window_blocks(128, BATCHED_TOKENS, 1024, 128),
    ).layout
    assert predicted is not None
    assert engine == predicted.blocks(1024, 128) == 12  # 8 full + 4 sliding


async def test_through_the_sidecar_the_growing_requests_do_not_preempt(
    hybrid_server: VllmServer, hybrid_model: Path
) -> None:
    _, proxied, layout = await straight_then_through(hybrid_server.url, hybrid_model, GROWING)
    assert proxied.preemptions == 0
    assert layout == {
        "full_attention_groups": 1,
        "sliding_window_groups": 1,
        "sliding_window_cap_blocks": 4,
        "speculative_tokens": 0,
    }


async def test_without_the_models_layers_capacity_falls_back_and_says_why(hybrid_server: VllmServer) -> None:
    app = await start_beside(hybrid_server.url, None)
    try:
        assert app.controller.policy() is AdmissionMode.LANES
        policy = (await admission_status(app))["policy"]
        assert isinstance(policy, dict)
        assert "the engine plans 12 blocks for a 1024-token request, not 8" in str(policy["fallback"])
    finally:
        await app.stop()
