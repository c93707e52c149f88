"""vLLM's pages (all recorded fixtures) mapped to EngineSnapshot."""

from __future__ import annotations

import contextlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.signals import MetricsParseError, parse_vllm_metrics
from tests.fake_vllm import AFTER_LOAD_PAGE, GPU_PAGE, PRESSURE_PAGE, V0_PAGE, page, substitute

# page: kv usage, metric name, running, waiting, preemptions, pool tokens, block size, cache dtype,
# gpu_memory_utilization, model
EXPECTED = {
    PRESSURE_PAGE: (1.0, "vllm:kv_cache_usage_perc", 3, 5, 1, 2048, 128, "auto", 0.92, "tiny"),
    AFTER_LOAD_PAGE: (0.0, "vllm:kv_cache_usage_perc", 0, 0, 1, 2048, 128, "auto", 0.92, "tiny"),
    GPU_PAGE: (
        0.0011764705882353343,
        "vllm:kv_cache_usage_perc",  # 0.10 exports both names; the new one wins
        0,
        0,
        0,
        13600,
        16,
        "auto",
        0.9,
        "Qwen/Qwen3-4B-Instruct-2507-FP8",
    ),
    V0_PAGE: (
        0.0,
        "vllm:gpu_cache_usage_perc",
        0,
        0,
        0,
        81767 * 16,
        16,
        "auto",
        0.9,
        "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_fixture_page(name: str) -> None:
    snap = parse_vllm_metrics(page(name))
    usage, metric, running, waiting, preemptions, pool, block, dtype, util, model = EXPECTED[name]
    assert snap.kv_usage == pytest.approx(usage)
    assert snap.kv_usage_metric == metric
    assert (snap.running, snap.waiting, snap.preemptions_total) == (running, waiting, preemptions)
    assert snap.cache_config is not None
    assert snap.cache_config.pool_tokens == pool
    assert snap.cache_config.block_size == block
    assert snap.cache_config.cache_dtype == dtype
    assert snap.cache_config.gpu_memory_utilization == util
    assert snap.model_name == model


def test_current_page_details() -> None:
    snap = parse_vllm_metrics(page(PRESSURE_PAGE))
    assert snap.waiting_by_reason == {"capacity": 5.0, "deferred": 0.0}
    assert snap.prompt_tokens_total == 2974.0
    assert snap.prefix_cache_queries_total == 2974.0
    assert snap.prefix_cache_hits_total == 0.0
    config = snap.cache_config
    assert config is not None
    assert (config.kv_cache_size_tokens, config.kv_cache_max_concurrency) == (2048, 2.0)
    assert (config.num_gpu_blocks_override, config.kv_cache_memory_bytes) == (16, 1073741824)
    assert config.enable_prefix_caching is True
    assert config.mamba_ssm_cache_dtype == "auto"  # a model without state layers: the default
    assert config.mamba_cache_dtype == "auto"
    assert list(snap.engines) == ["0"]


def test_gpu_page_uses_old_prefix_cache_names_and_tolerates_repeats() -> None:
    snap = parse_vllm_metrics(page(GPU_PAGE))
    assert snap.prefix_cache_queries_total == 246.0
    assert snap.prefix_cache_hits_total == 80.0


def test_v0_page_has_swapped_and_no_engine_label() -> None:
    snap = parse_vllm_metrics(page(V0_PAGE))
    assert snap.swapped == 0.0
    assert list(snap.engines) == ["0"]
    assert snap.cache_config is not None
    assert snap.cache_config.enable_prefix_caching is False


def test_new_name_wins_when_both_are_present() -> None:
    text = page(PRESSURE_PAGE) + '\nvllm:gpu_cache_usage_perc{engine="0",model_name="tiny"} 0.25\n'
    snap = parse_vllm_metrics(text)
    assert (snap.kv_usage, snap.kv_usage_metric) == (1.0, "vllm:kv_cache_usage_perc")


def test_renamed_metric_leaves_kv_usage_unknown() -> None:
    text = page(PRESSURE_PAGE).replace("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_fraction")
    snap = parse_vllm_metrics(text)
    assert snap.kv_usage is None
    assert snap.kv_usage_metric is None
    assert snap.running == 3.0


def _two_engines() -> str:
    text = substitute(page(PRESSURE_PAGE), "vllm:kv_cache_usage_perc", 0.5)
    extra = [
        line.replace('engine="0"', 'engine="1"')
        for line in text.splitlines()
        if line.startswith(
            ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_preemptions_total")
        )
    ]
    extra = [
        ln.rsplit(" ", 1)[0] + (" 0.9" if ln.startswith("vllm:kv_cache_usage_perc") else " 2.0")
        for ln in extra
    ]
    return text + "\n" + "\n".join(extra) + "\n"


def test_several_engines_are_kept_and_aggregated() -> None:
    snap = parse_vllm_metrics(_two_engines())
    assert set(snap.engines) == {"0", "1"}
    assert snap.engines["0"].kv_usage == 0.5
    assert snap.engines["1"].kv_usage == 0.9
    assert snap.kv_usage == 0.9  # the most saturated engine
    assert snap.running == 3.0 + 2.0
    assert snap.preemptions_total == 1.0 + 2.0


def test_nan_usage_is_ignored_in_the_aggregate() -> None:
    snap = parse_vllm_metrics(substitute(page(PRESSURE_PAGE), "vllm:kv_cache_usage_perc", "NaN"))
    assert snap.engines["0"].kv_usage is not None
    assert math.isnan(snap.engines["0"].kv_usage)
    assert snap.kv_usage is None


def test_garbage_is_a_typed_error() -> None:
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics("vllm:kv_cache_usage_perc{engine=0} x\n")


def test_empty_and_foreign_pages_parse_to_an_empty_snapshot() -> None:
    for text in ("", "node_cpu_seconds_total 5\n", "<html>502 Bad Gateway</html>"):
        snap = parse_vllm_metrics(text)
        assert snap.kv_usage_metric is None
        assert snap.engines == {}


def test_truncated_page() -> None:
    text = page(PRESSURE_PAGE)
    cut = text.index("vllm:kv_cache_usage_perc{") + len("vllm:kv_cache_usage_perc{eng")
    with pytest.raises(MetricsParseError):
        parse_vllm_metrics(text[:cut])


@settings(max_examples=200)
@given(st.integers(min_value=0, max_value=50_000), st.binary(max_size=64))
def test_fuzzed_real_page_raises_only_typed_errors(position: int, noise: bytes) -> None:
    text = page(PRESSURE_PAGE)
    position %= len(text)
    mutated = text[:position] + noise.decode("latin-1") + text[position:]
    with contextlib.suppress(MetricsParseError):
        parse_vllm_metrics(mutated)
