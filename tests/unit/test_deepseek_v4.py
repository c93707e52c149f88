"""DeepSeek-V4's compressed attention: the five caches vLLM 0.32.0 keeps and the pool it packs them into.

Before, the plan read DeepSeek-V4-Flash as 43 layers of one 512-wide KV head, keys and values in bf16: 88,064
bytes a token, where vLLM keeps 64 FP8 states of 584 bytes per 256 tokens in the 21 ratio-4 layers, 2 in the
20 ratio-128 layers and the indexer's 132-byte keys beside the first (3,915 bytes a token with the pages'
padding), a 128-token window in every layer and the compressors' float32 states: 22 times fewer bytes a token,
and each request's windows and states at a fixed cost instead. The engine's groups, pages and blocks are
checked on the real CPU server by ``tests/e2e/test_deepseek_v4.py``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.admission.geometry import GroupLayout, WindowGroups
from sidecar.budget import PlanRequest, architecture_from_config, build_ledger
from sidecar.budget.deepseek_v4 import (
    BLOCK_SIZE,
    CacheLayer,
    PackedGroup,
    V4Attention,
    approximate_gcd,
    cache_layers,
    pack,
    v4_attention,
    v4_pool,
)
from sidecar.budget.dtypes import MXFP4_BYTES
from sidecar.budget.kv_terms import plan_gaps
from sidecar.budget.parameters import computed_parameter_count, expert_parameter_count
from sidecar.budget.profile import indexer_replicas_bytes, rope_cache_bytes
from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.pool import admission_pool
from sidecar.signals import parse_vllm_metrics
from sidecar.units import GIB
from tests.fake_vllm import substitute_label

DATA = Path(__file__).parents[1] / "data" / "vllm"
TINY = json.loads((DATA / "tiny-deepseek-v4-config.json").read_text())
TINY_PAGE = DATA / "vllm-0.32.0-cpu-tiny-deepseek-v4.prom"  # the real CPU server: 874 blocks per request
SWEEP = Path(__file__).parents[1] / "data" / "transformers-defaults-sweep.json"
FLASH_RATIOS = [0, 0] + [4, 128] * 20 + [4, 0]  # 43 layers and the MTP placeholder
FLASH: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 4096,
    "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8, "index_head_dim": 128,
    "index_n_heads": 64, "index_topk": 512, "sliding_window": 128, "compress_ratios": FLASH_RATIOS,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
    "num_hash_layers": 3, "num_nextn_predict_layers": 1, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "max_position_embeddings": 1048576, "vocab_size": 129280, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536,
                     "type": "yarn"},
}  # fmt: skip
"""DeepSeek-V4-Flash-Base's published config.json (its architecture fields) as a public repository's test of
the ``rtp_llm`` package restates it, "Authoritative DeepSeek-V4-Flash-Base config (as published on HF)" (code
index id 59855246185; the repository is not named there)."""
SWA, C4, C4_INDEX, C128 = 37440, 37440, 8640, 1728  # fp8_ds_mla pages: 64 x 584, 64 x 132, 2 x 584, padded
C4_STATE, C4_INDEX_STATE, C128_STATE = 32832, 8640, 32832  # float32 states: 4 x 2048, 4 x 512, 8 x 1024


def test_the_ratios_are_read_from_the_published_and_the_transformers_fields() -> None:
    """``compress_ratios`` (0: a window only, the trailing MTP entry dropped), or transformers 5's fields."""
    attention = v4_attention(FLASH, "deepseek_v4", 43)
    assert attention is not None
    assert attention.ratios == (1, 1) + (4, 128) * 20 + (4,)
    assert (attention.head_dim, attention.index_head_dim, attention.window) == (512, 128, 128)
    saved = {
        "layer_types": ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    }
    read = v4_attention(saved, "deepseek_v4", 3)
    assert read is not None
    assert read.ratios == (1, 4, 128)
    assert v4_attention(FLASH, "deepseek_v3", 43) is None


@pytest.mark.parametrize(
    ("dtype", "pages"),
    [
        ("fp8_ds_mla", [SWA, C4, C4_INDEX, C4_STATE, C4_INDEX_STATE, SWA, C128, C128_STATE]),
        # plain bf16 rows: 1,024 bytes a state, pages padded to 512 bytes
        ("bf16", [65536, 65536, 8704, 32768, 8192, 65536, 2048, 32768]),
    ],
)
def test_each_layer_registers_its_window_latents_indexer_and_states(dtype: str, pages: list[int]) -> None:
    layers = cache_layers(
        V4Attention((4, 128), 512, 128, 128), block_size=BLOCK_SIZE, kv_cache_dtype=dtype, indexer_fp4=False
    )
    assert [layer.page for layer in layers] == pages
    assert [(layer.block, layer.window) for layer in layers] == [
        (64, 128), (256, None), (256, None), (4, 8), (4, 8), (64, 128), (256, None), (8, 128),
    ]  # fmt: skip


def test_an_mxfp4_indexer_keeps_68_bytes_a_state() -> None:
    layers = cache_layers(
        V4Attention((4,), 512, 128, 128), block_size=BLOCK_SIZE, kv_cache_dtype="fp8_ds_mla", indexer_fp4=True
    )
    assert layers[2].page == 4608  # 64 x 68 = 4,352, padded to 576 bytes


@pytest.mark.parametrize(
    ("values", "floor", "expected"),
    [
        ([43, 21, 20], 21, 22),
        ([4, 2, 1], 2, 2),
        ([6, 3], 3, 3),
        ([5, 2], 2, 2),
        ([3], 1, 3),
    ],  # ([3], 1): a tie
)
def test_the_repeats_per_group_pad_least_and_prefer_the_larger(
    values: list[int], floor: int, expected: int
) -> None:
    assert approximate_gcd(values, floor) == expected


def test_the_flash_pool_packs_five_groups_of_one_stride() -> None:
    """43 windows split in two (22 and 21 repeats), the compressed caches whole, the states whole."""
    pool = v4_pool(v4_attention(FLASH, "deepseek_v4", 43), "auto")  # type: ignore[arg-type]
    full = 21 * (C4 + C4_INDEX) + 20 * C128
    assert pool.groups == (
        PackedGroup(64, 128, 22 * SWA), PackedGroup(64, 128, 21 * SWA), PackedGroup(256, None, full),
        PackedGroup(4, 8, 21 * (C4_STATE + C4_INDEX_STATE)), PackedGroup(8, 128, 20 * C128_STATE),
    )  # fmt: skip
    assert pool.stride == full == 1_002_240
    assert round(pool.bytes_per_token) == 3915
    # 1M tokens, two 8,192-token batches in flight: windows 2 x 259, latents 4,096, states 4,099 and 2,065
    assert pool.blocks_per_request(1_048_576, 16384) == 2 * 259 + 4096 + 4099 + 2065


def test_pack_keeps_an_unbalanced_bucket_whole() -> None:
    layers = [CacheLayer(64, 100, 8)] * 3 + [CacheLayer(64, 50, 8)] * 2 + [CacheLayer(4, 10, 8)] * 2
    pool = pack(layers + [CacheLayer(4, 20, 8)] * 2)
    assert pool.groups == (PackedGroup(64, 8, 400), PackedGroup(4, 8, 60))


def test_the_ledger_plans_flash_at_a_million_tokens_as_vllm_packs_it() -> None:
    request = PlanRequest(
        architecture_from_config(FLASH), 141 * GIB, tensor_parallel_size=8, max_model_len=1_048_576,
        max_num_batched_tokens=8192, async_scheduling=True,
    )  # fmt: skip
    ledger = build_ledger(request)
    blocks = 2 * 259 + 4096 + 4099 + 2065
    assert ledger.kv_bytes_per_token == 3915  # was 88,064: 43 layers of K and V at bf16
    assert ledger.kv_bytes_per_sequence == blocks * 1_002_240
    assert ledger.kv_pool_blocks == ledger.kv_pool_bytes // 1_002_240
    assert ledger.block_size == 256  # the latents' block; the windows' is 64, the states' 4 and 8
    assert ledger.max_concurrency == round(ledger.kv_pool_blocks / blocks, 2)
    assert ledger.kv_pool_tokens == int(ledger.kv_pool_blocks / blocks * 1_048_576)
    assert ledger.verdict.value != "does-not-fit"
    assert "compressed_sparse_attention" not in " ".join(ledger.notes)
    assert (
        "DeepSeek-V4: 5 KV cache groups, every cache whole on each GPU; a 1,048,576-token request holds 10,778 "
        "blocks of 1,002,240 bytes, 6,682 of them for its 128-token windows and compressor states whatever its "
        "length (16,384 tokens in flight)"
    ) in ledger.notes
    assert not any("KV heads over" in note for note in ledger.notes)
    assert plan_gaps(request.architecture) is None  # caches, compressors, indexers, hyper-connections


def _monitor(config: dict[str, Any], max_model_len: int, **settings: Any) -> Monitor:
    inputs = PlanInputs(
        architecture=architecture_from_config(config), model="flash", gpu_memory_bytes=141 * GIB,
        max_model_len=max_model_len, **settings,
    )  # fmt: skip
    return Monitor(inputs, MonitorSettings(), make_logger(io.StringIO()))


def test_admission_plans_the_predicted_pool_over_its_five_groups() -> None:
    """Before the engine reports: the latents' group whole, the windows and states capped at the prediction's."""
    monitor = _monitor(
        FLASH, 131072, tensor_parallel_size=8, max_num_batched_tokens=8192, async_scheduling=True
    )
    monitor.refresh(0.0)
    assert monitor.ledger is not None
    answer = admission_pool(monitor)
    assert answer.view is not None
    assert answer.view.blocks == monitor.ledger.kv_pool_blocks - 1  # vLLM's null block
    assert answer.view.layout == GroupLayout(
        full=1, full_block=256,
        windows=(WindowGroups(2, 64, 259), WindowGroups(1, 4, 4099), WindowGroups(1, 8, 2065)),
    )  # fmt: skip
    assert answer.view.layout.reserved_blocks(131072, 256) == 512 + 2 * 259 + 4099 + 2065
    # a 1,000-token sequence: 4 latent blocks, 16 in each window group, 250 and 125 of compressor states
    assert answer.view.sequence_blocks(1000) == 4 + 2 * 16 + 250 + 125


def test_admission_reads_the_tokens_in_flight_from_the_real_engines_figure() -> None:
    """The real CPU server's page: 874 blocks per 4,096-token request, which 2,048 tokens in flight give."""
    monitor = _monitor(
        TINY, 4096
    )  # the prediction's own in-flight guess differs (8,192 x 2 on a 141 GiB GPU)
    monitor.record_success(parse_vllm_metrics(TINY_PAGE.read_text()), now=0.0)
    answer = admission_pool(monitor)
    assert answer.view is not None
    assert (answer.view.blocks, answer.view.block_size) == (11435, 4)
    assert answer.view.layout == GroupLayout(
        full=1, full_block=256,
        windows=(WindowGroups(2, 64, 35), WindowGroups(1, 4, 515), WindowGroups(1, 8, 273)),
    )  # fmt: skip
    assert answer.view.layout.reserved_blocks(4096, 4) == 874
    assert not answer.view.shares_prefixes


def test_a_figure_no_tokens_in_flight_explain_falls_back_with_the_reason() -> None:
    # 40 blocks: fewer than the 42 a request holds with nothing in flight (16 latent, 2 x 3 window, 3 and 17 state)
    page = substitute_label(
        TINY_PAGE.read_text(), "vllm:cache_config_info", "kv_cache_max_concurrency", "285.9"
    )
    monitor = _monitor(TINY, 4096)
    monitor.record_success(parse_vllm_metrics(page), now=0.0)
    answer = admission_pool(monitor)
    assert answer.view is None
    assert answer.why.startswith("the engine plans 40 blocks for a 4096-token request, which DeepSeek-V4's 5")


def test_the_parameters_are_transformers_count_and_the_replicas_are_on_every_gpu() -> None:
    """transformers 5.19 builds 284,325,869,015 parameters from its default DeepSeek-V4 config (the sweep)."""
    sweep = json.loads(SWEEP.read_text())["families"]["deepseek_v4"]
    arch = architecture_from_config(sweep["config"])
    assert computed_parameter_count(arch) == sweep["parameters"]["total"]  # was 290.94B: Llama's attention
    request = PlanRequest(arch, 141 * GIB, tensor_parallel_size=8, max_model_len=131072)
    v4 = arch.v4
    assert v4 is not None
    layer = 4096 * (1024 + 512) + 1024 + 512  # fused_wqa_wkv and its norms, in every layer
    compressors = {4: 2 * 4096 * 1024 + 4 * 1024 + 512, 128: 2 * 4096 * 512 + 128 * 512 + 512}
    indexer = 1024 * 64 * 128 + 4096 * 64 + 2 * 4096 * 256 + 4 * 256 + 128
    whole = sum(layer + compressors.get(r, 0) + (indexer if r == 4 else 0) for r in v4.ratios)
    assert indexer_replicas_bytes(request) == round(whole * 2 * 7 / 8)
    note = " ".join(build_ledger(request).notes)
    assert "query and KV down-projections, compressors and indexers, whole on every GPU" in note


@pytest.mark.parametrize(
    ("expert_dtype", "element"), [("fp4", MXFP4_BYTES), ("fp8", 1.0), (None, MXFP4_BYTES)]
)
def test_an_fp8_checkpoint_keeps_its_experts_in_the_expert_dtype(
    expert_dtype: str | None, element: float
) -> None:
    """DeepSeek-V4-Flash: FP8 linear layers and MXFP4 experts (``expert_dtype`` ``fp4``, vLLM's default)."""
    config = FLASH | {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    if expert_dtype:
        config["expert_dtype"] = expert_dtype
    arch = architecture_from_config(config)
    ledger = build_ledger(PlanRequest(arch, 141 * GIB, tensor_parallel_size=4, max_model_len=131072))
    experts = expert_parameter_count(arch)
    others = ledger.parameters - experts
    assert ledger.weights_bytes == round(others * 1.0 / 4 + experts * element / 4)


def test_the_rope_tables_are_two_float32_tables_of_the_rope_dimension() -> None:
    """Window-only layers: 1,048,576 positions; compressed ones: YaRN's 65,536 x 16; 64 values, float32 each."""
    request = PlanRequest(
        architecture_from_config(FLASH), 141 * GIB, tensor_parallel_size=8, max_model_len=4096
    )
    assert rope_cache_bytes(request) == 2 * 1_048_576 * 64 * 4  # was 1 GiB: 512 values a row, one bf16 table
    only_compressed = FLASH | {"compress_ratios": [4, 128] * 21 + [4, 0]}
    request = PlanRequest(architecture_from_config(only_compressed), 141 * GIB, max_model_len=4096)
    assert rope_cache_bytes(request) == 1_048_576 * 64 * 4


@pytest.mark.parametrize(
    ("gpu", "served"), [("h100", True), ("h200", True), ("a100-80gb", False), ("l40s", False)]
)
def test_a_gpu_without_its_attention_kernels_is_named(gpu: str, served: bool) -> None:
    """vLLM 0.32's DeepSeek-V4 attention needs compute capability 9.x, 10.x or 12.x."""
    request = PlanRequest(architecture_from_config(FLASH), 80 * GIB, gpu=gpu, max_model_len=4096)
    named = any("has no kernel for it" in note for note in build_ledger(request).notes)
    assert named is not served


@pytest.mark.parametrize(("kv_cache_dtype", "warned"), [("auto", False), ("fp8", False), ("bfloat16", True)])
def test_sixteen_bit_kv_says_the_default_backend_refuses_it(kv_cache_dtype: str, warned: bool) -> None:
    request = PlanRequest(
        architecture_from_config(FLASH),
        141 * GIB,
        gpu="h200",
        max_model_len=4096,
        kv_cache_dtype=kv_cache_dtype,
    )
    named = any("keeps fp8_ds_mla only and refuses to start" in note for note in build_ledger(request).notes)
    assert named is warned
