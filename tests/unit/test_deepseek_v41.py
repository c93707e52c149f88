"""DeepSeek-V4.1: caches shared from its source layers, packed as vLLM 0.32.0 packs them, and its GPU weights.

Before, ``plan`` read DeepSeek-V4.1-Flash as a generic MLA model: 81,920 bytes a token where vLLM keeps about
1,827 (the latents and indexer keys of four source layers, a window in every layer, three compressor rings),
its experts at FP8 where the checkpoint keeps them in MXFP4 (521.6 GiB of weights on one GPU's plan against
about 277), and a note that said the caches were not modelled. The packing is vLLM's own code run on these
specs in ``tests/e2e/test_deepseek_v41.py``; the CPU server cannot build the model itself.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.admission.geometry import GroupLayout, WindowGroups
from sidecar.budget import PlanRequest, architecture_from_config, build_ledger, load_architecture
from sidecar.budget.deepseek_v4 import PackedGroup, V4Attention, pack
from sidecar.budget.deepseek_v41 import (
    HOPPER,
    compressed_pool,
    engram_host_bytes,
    ring_rows,
    v41_cache_layers,
    v41_layer_parameters,
    v41_record,
)
from sidecar.budget.parameters import computed_parameter_count
from sidecar.budget.profile import indexer_replicas_bytes
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.logs import make_logger
from sidecar.monitor.diagnose import MonitorSettings
from sidecar.monitor.monitor import Monitor
from sidecar.monitor.planning import PlanInputs
from sidecar.monitor.pool import admission_pool
from sidecar.units import GIB
from tests.unit.test_hub_models import safetensors

TEXT: dict[str, Any] = {
    "model_type": "deepseek_v41_text", "vocab_size": 129280, "hidden_size": 5120, "moe_intermediate_size": 2304,
    "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "qk_rope_head_dim": 64, "q_lora_rank": 1280, "o_lora_rank": 1024, "o_groups": 8, "hidden_act": "silu",
    "rms_norm_eps": 1e-20, "tie_word_embeddings": False, "max_position_embeddings": 1048576,
    "rope_theta": 10000, "rope_scaling": {"rope_type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                                          "original_max_position_embeddings": 65536},
    "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 6, "sliding_window": 128,
    "compress_ratios": [0, 0, *[2] * 18, *[1] * 20, 0, 0, 0], "compress_rope_theta": 160000,
    "kv_source_layer_ids": [2, 8, 14, 20], "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "index_n_heads": 32, "index_head_dim": 128, "index_topk": 512, "candidate_source_layer_id": 20,
    "hc_mult": 4, "engram_layer_ids": [1, 14], "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4, "engram_vocab_size": 16000000, "engram_n_heads": 8, "engram_head_dim": 256,
    "engram_compressed_vocab_size": 99092, "num_nextn_predict_layers": 3,
}  # fmt: skip
FLASH: dict[str, Any] = {
    "architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                            "scale_fmt": "ue8m0", "expert_dtype": "fp4"},
    "text_config": TEXT,
    "vision_config": {"model_type": "deepseek_v41_vision", "num_hidden_layers": 32, "hidden_size": 1024,
                      "num_attention_heads": 16, "intermediate_size": 2816, "patch_size": 14, "rope_theta": 10000,
                      "downsample_ratio": 3, "max_image_tokens": 1024, "min_pixels": 295936, "max_wh_ratio": None},
}  # fmt: skip
"""``deepseek-ai/DeepSeek-V4.1-Flash/config.json``'s architecture fields, as a public repository's test restates
it "verbatim ... trimmed to the keys the spec reads" (code index id 68609567715)."""
WINDOW, LATENT, RING = 19008, 116928, 98304  # H200 pages: 32 x 584 padded to 576s; the latent group; 3 rings


def _attention(config: dict[str, Any] = FLASH) -> V4Attention:
    attention = architecture_from_config(config).v4
    assert attention is not None
    assert attention.v41
    return attention


def test_the_sources_own_the_caches_and_the_other_layers_only_a_window() -> None:
    attention = _attention()
    assert attention.ratios == (0, 0, *[2] * 18, *[1] * 20)  # the MTP layers' ratios cut at 40 layers
    assert (attention.kv_sources, attention.index_sources[:4]) == ((2, 8, 14, 20), (2, 8, 14, 20))
    layers = v41_cache_layers(attention, HOPPER)
    assert len(layers) == 40 + 4 + 4 + 3  # a window each; four sources' latents and keys; three rings
    assert sorted({(c.block, c.page) for c in layers if c.window is None and not c.ring}) == [
        (64, 4608), (64, 8640), (64, 19008), (64, 37440),  # ratio-2 and ratio-1 keys and latents
    ]  # fmt: skip
    assert {(c.block, c.page) for c in layers if c.ring} == {(8, 8 * 1024 * 4)}


def test_the_flash_pool_packs_one_latent_group_seven_window_groups_and_one_ring_group() -> None:
    """The groups and pages vLLM's own ``_get_packed_kv_cache_groups`` gives (tests/e2e/test_deepseek_v41.py)."""
    pool = pack(v41_cache_layers(_attention(), HOPPER))
    windows = [PackedGroup(32, 128, 6 * WINDOW)] * 5 + [PackedGroup(32, 128, 5 * WINDOW)] * 2
    assert sorted(pool.groups, key=repr) == sorted(
        [*windows, PackedGroup(64, None, LATENT), PackedGroup(8, None, 3 * 32768, ring=True)], key=repr
    )
    assert pool.stride == LATENT
    assert pool.blocks_per_request(1_048_576, 16384) == 16384 + 7 * 517 + 1  # as vLLM's concurrency counts
    assert round(pool.bytes_per_token) == 1827


@pytest.mark.parametrize(
    ("gpu", "tp", "backend", "block", "latent"),
    [
        ("h200", 8, "FlashMLA (V4 record)", 64, 584),
        ("b200", 8, "mega attention (nvfp4_ds_mla)", 128, 288),  # 8 heads a wo_a group at TP 8
        ("b200", 16, "FlashMLA (V4.1 MXFP8 record)", 128, 528),  # TP 16 splits the 8 groups: no mega kernel
    ],
)
def test_the_record_follows_the_default_backend(
    gpu: str, tp: int, backend: str, block: int, latent: int
) -> None:
    record = v41_record(_attention(), 64, gpu, tp)
    assert (record.backend, record.block, record.latent_bytes) == (backend, block, latent)


def test_speculative_drafts_widen_the_ring() -> None:
    assert [ring_rows(k) for k in (0, 1, 6, 7)] == [8, 8, 8, 16]


def test_the_ledger_plans_flash_on_eight_h200s() -> None:
    request = PlanRequest(
        architecture_from_config(FLASH), 141 * GIB, gpu="h200", tensor_parallel_size=8,
        max_model_len=1_048_576, max_num_batched_tokens=8192, async_scheduling=True,
    )  # fmt: skip
    ledger = build_ledger(request)
    assert ledger.kv_bytes_per_token == 1827  # was 81,920
    assert ledger.kv_bytes_per_sequence == 20004 * LATENT
    assert ledger.block_size == 64
    assert ledger.max_concurrency == round(ledger.kv_pool_blocks / 20004, 2)
    notes = " ".join(ledger.notes)
    assert "DeepSeek-V4.1: 9 KV cache groups" in notes
    assert "188.8 GiB) stay in pinned host memory" in notes
    assert "not modelled for this config" not in notes
    # MXFP4 experts: 384 x 40 x 3 x 5120 x 2304 parameters at 17/32 bytes, 8 ways
    assert 34 * GIB < ledger.weights_bytes < 35 * GIB


def test_speculative_decoding_widens_the_rings_in_the_plan() -> None:
    """Seven drafts: 16-row rings of 64 KiB, of which one fits the latent group's page: three ring groups."""

    def rings(speculative: SpeculativeSettings | None) -> list[PackedGroup]:
        request = PlanRequest(
            architecture_from_config(FLASH), 141 * GIB, gpu="h200", tensor_parallel_size=8,
            max_model_len=131072, speculative=speculative,
        )  # fmt: skip
        pool = compressed_pool(request)
        assert pool is not None
        return [group for group in pool.groups if group.ring]

    assert rings(None) == [PackedGroup(8, None, 3 * 8 * 4096, ring=True)]
    assert (
        rings(SpeculativeSettings("mtp", num_speculative_tokens=7))
        == [PackedGroup(16, None, 16 * 4096, True)] * 3
    )


def test_compressors_and_indexers_are_counted_in_their_source_layers_only() -> None:
    attention, hidden, heads = _attention(), 5120, 64
    plain = v41_layer_parameters(attention, hidden, heads, 3)  # ratio 2, neither a kv nor an index source
    assert plain == attention.layer_parameters(hidden, heads, 1)
    compressor = hidden * 512 * 2 + 512  # fused_wkv_wgate (kv and gate) and its norm
    indexer = 1280 * 32 * 128 + hidden * 32 + 512 * 128 + 128  # wq_b, weights_proj, wk and its norm
    assert v41_layer_parameters(attention, hidden, heads, 8) == plain + compressor + indexer
    assert v41_layer_parameters(attention, hidden, heads, 24) == plain + 1280 * 32 * 128 + hidden * 32
    assert (
        v41_layer_parameters(attention, hidden, heads, 20) == plain + hidden * 512 + 512 + indexer
    )  # no gate
    engram = 24 * 256 * hidden * 5 + 2 * 4 * hidden  # wkv to (hc + 1) x hidden, q_weight, k_weight
    assert v41_layer_parameters(attention, hidden, heads, 1) == plain + engram


def test_the_replicated_parts_are_whole_on_every_gpu() -> None:
    request = PlanRequest(architecture_from_config(FLASH), 141 * GIB, gpu="h200", tensor_parallel_size=8)
    attention = _attention()
    base = 40 * (5120 * (1280 + 512) + 1280 + 512)  # fused_wqa_wkv and its norms in every layer
    extras = (
        3 * (5120 * 1024 + 512) + (5120 * 512 + 512) + 4 * (512 * 128 + 128) + 8 * (1280 * 4096 + 5120 * 32)
    )
    assert indexer_replicas_bytes(request) == round((base + extras) * 1 * (1 - 1 / 8))
    arch = architecture_from_config(FLASH)
    layers = sum(v41_layer_parameters(attention, 5120, 64, i) for i in range(40))
    experts = 40 * ((384 + 1) * 3 * 5120 * 2304 + 5120 * 384)  # routed, shared, gate (its bias a buffer)
    norms = 40 * 2 * 5120 + 5120
    # no hc_head: V4.1 collapses the streams with the last layer's mix
    tower = arch.vision_parameters
    assert tower
    assert computed_parameter_count(arch) == layers + experts + norms + 2 * 129280 * 5120 + tower
    assert attention.mxfp4_experts


def test_the_engram_tables_are_named_with_their_host_bytes() -> None:
    assert engram_host_bytes(_attention()) == (384006168 + 384016682) * (256 + 8)


def test_admission_counts_a_ring_block_per_request() -> None:
    inputs = PlanInputs(
        architecture=architecture_from_config(FLASH), model="flash", gpu_memory_bytes=141 * GIB, gpu="h200",
        max_model_len=131072, tensor_parallel_size=8, max_num_batched_tokens=8192, async_scheduling=True,
    )  # fmt: skip
    monitor = Monitor(inputs, MonitorSettings(), make_logger(io.StringIO()))
    monitor.refresh(0.0)
    answer = admission_pool(monitor)
    assert answer.view is not None
    assert answer.view.layout == GroupLayout(
        full=1, full_block=64, windows=(WindowGroups(7, 32, 517), WindowGroups(1, 8, 1))
    )
    # a 1,000-token sequence: 16 latent blocks, 32 in each window group, one ring block
    assert answer.view.sequence_blocks(1000) == 16 + 7 * 32 + 1


def test_the_vision_tower_is_vllms_vit_and_aligner() -> None:
    """32 blocks of 12,851,200 (norms, q/k/v and output with biases, gated MLP), the patch embedding, the final
    norm, the aligner from the 3 x 3-merged width and the image start, end and newline vectors."""
    block = 2 * 1024 + 4 * 1024 * 1024 + 4 * 1024 + 3 * 1024 * 2816
    assert block == 12_851_200
    aligner = 9 * 1024 * 5120 + 5120 + 5120 * 5120 + 5120
    expected = (588 * 1024 + 1024) + 32 * block + 1024 + aligner + 3 * 5120
    assert architecture_from_config(FLASH).vision_parameters == expected == 485_268_480


def test_the_catalogs_b200_plans_the_mega_attention_record() -> None:
    """``--gpu b200`` (183,359 MiB, compute capability 10.0): 128-token blocks of NVFP4 latents."""
    request = PlanRequest(
        architecture_from_config(FLASH), 183359 * 1024 * 1024, gpu="b200", tensor_parallel_size=8,
        max_model_len=1_048_576,
    )  # fmt: skip
    ledger = build_ledger(request)
    assert (ledger.block_size, ledger.kv_bytes_per_token) == (128, 135168 // 128)
    assert "mega attention (nvfp4_ds_mla)" in " ".join(ledger.notes)


def test_the_engram_tables_are_not_counted_from_the_headers(tmp_path: Path) -> None:
    """An FP8-expert V4.1 checkpoint's headers count its tensors, but not the n-gram tables vLLM keeps on the
    host (``layers.N.engram.embed.*``, as its WeightsMapper reads them)."""
    config = FLASH | {"quantization_config": FLASH["quantization_config"] | {"expert_dtype": "fp8"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = {"layers.0.attn.wq_b.weight": [4, 8], "layers.1.engram.embed.weight": [64, 256]}
    (tmp_path / "model.safetensors").write_bytes(safetensors(tensors))
    arch = load_architecture(tmp_path)
    assert not arch.packed_weights
    assert arch.parameter_count == 32


@pytest.mark.parametrize(
    ("gpu", "named"),
    [("NVIDIA GeForce RTX 5090", True), ("NVIDIA GB10", True), ("NVIDIA RTX 5000 Ada Generation", False)],
)
def test_compute_capability_12_is_named_as_not_modelled(gpu: str, named: bool) -> None:
    request = PlanRequest(architecture_from_config(FLASH), 120 * GIB, gpu=gpu, max_model_len=65536)
    notes = " ".join(build_ledger(request).notes)
    assert ("FlashInfer's SM120 class" in notes) is named
