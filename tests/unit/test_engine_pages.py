"""Every engine of the gateway's model-server protocol: recorded pages mapped to one EngineSnapshot."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.signals.engines import detect, parse_engine_metrics
from sidecar.signals.kinds import EngineKind
from tests.fake_vllm import PRESSURE_PAGE, page

PAGES = Path(__file__).parents[1] / "data" / "engines"

# file: kind, kv usage, running, waiting, preemptions, (block size, blocks), ranks, model
EXPECTED = {
    "sglang-0.4.1-docs-production-metrics.prom": (
        EngineKind.SGLANG, 0.28, 162, 2826, None, None, ["0"], "meta-llama/Llama-3.1-8B-Instruct",
    ),
    "sglang-0.5.1-issue13485-excerpt.prom": (EngineKind.SGLANG, 0.0, 1, None, None, None, ["0"], "Qwen-32B"),
    "sglang-dp-attention-aibrix1614-excerpt.prom": (
        EngineKind.SGLANG, None, None, 0, None, None, ["1", "3"], "deepseek-r1",
    ),
    "sglang-0.5.23-SYNTHESIZED-from-source.prom": (
        EngineKind.SGLANG, 0.15, 12, 3, 2, (1, 412568), ["0"], "Qwen/Qwen3-8B",
    ),
    "triton-trtllm-v0.21.0-readme.prom": (
        EngineKind.TRITON_TENSORRT_LLM, 0.4875, 1, 1, None, (64, 6239), ["0"], "tensorrt_llm",
    ),
    "triton-trtllm-v0.7.0-readme.prom": (
        EngineKind.TRITON_TENSORRT_LLM, None, 1, None, None, (64, 6239), ["0"], "tensorrt_llm",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_recorded_engine_page(name: str) -> None:
    text = (PAGES / name).read_text()
    kind, usage, running, waiting, preemptions, pool, ranks, model = EXPECTED[name]
    assert detect(text) is kind
    snap = parse_engine_metrics(text)
    assert snap.kind is kind
    assert snap.kv_usage == (pytest.approx(usage) if usage is not None else None)
    assert (snap.running, snap.waiting, snap.preemptions_total) == (running, waiting, preemptions)
    config = snap.cache_config
    assert (None if config is None else (config.block_size, config.num_gpu_blocks)) == pool
    assert sorted(snap.engines) == ranks
    assert snap.model_name == model


def test_a_page_of_no_engine_is_recognised_as_none() -> None:
    text = (PAGES / "trtllm-serve-preprefix-aibrix2004.prom").read_text()  # before the trtllm_ prefix
    assert detect(text) is None
    snap = parse_engine_metrics(text)
    assert snap.engines == {}
    assert snap.kv_usage_metric is None


def test_vllm_pages_stay_vllm() -> None:
    assert detect(page(PRESSURE_PAGE)) is EngineKind.VLLM
    assert parse_engine_metrics(page(PRESSURE_PAGE)).kind is EngineKind.VLLM


def test_sglang_priority_breakdowns_are_not_added_to_the_totals() -> None:
    text = "\n".join(
        [
            "# TYPE sglang:num_queue_reqs gauge",
            'sglang:num_queue_reqs{model_name="m",priority=""} 7.0',
            'sglang:num_queue_reqs{model_name="m",priority="0"} 4.0',
            'sglang:num_queue_reqs{model_name="m",priority="1"} 3.0',
            'sglang:token_usage{model_name="m",priority=""} 0.5',
        ]
    )
    assert parse_engine_metrics(text).waiting == 7.0


def test_sglang_pool_from_each_release_s_families() -> None:
    info = 'sglang:cache_config_info{num_pages="2048",page_size="16"} 1.0\nsglang:token_usage 0.1\n'  # 0.5.9-0.5.10
    gauges = "sglang:page_size 16.0\nsglang:num_pages 2048.0\nsglang:token_usage 0.1\n"  # 0.5.11+
    tokens = (
        "sglang:max_total_num_tokens 32768.0\nsglang:token_usage 0.1\n"  # 0.5.6-0.5.8: pages of one token
    )
    for text, expected in ((info, (16, 2048)), (gauges, (16, 2048)), (tokens, (1, 32768))):
        config = parse_engine_metrics(text).cache_config
        assert config is not None
        assert (config.block_size, config.num_gpu_blocks) == expected


def test_the_named_engine_wins_over_detection() -> None:
    text = (PAGES / "triton-trtllm-v0.21.0-readme.prom").read_text()
    assert parse_engine_metrics(text, EngineKind.SGLANG).engines == {}  # an SGLang reading finds nothing
