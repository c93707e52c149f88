"""DeepSeek-V4.1's shared compressed caches as vLLM 0.32.0 keeps them, and its weights on the GPU. Pure.

Theory of operation
-------------------
Read in vLLM 0.32.0 as installed (``vllm/models/deepseek_v41/attention.py``: ``DeepseekV4Attention``,
``DeepseekV4IndexerCache``, ``_resolve_dsv4_kv_cache_dtype``, ``_use_v41_mxfp8_kv_record``;
``compressor.py``: ``DeepseekCompressor``, ``CompressorStateCache``; ``nvidia/model.py``:
``_select_dsv4_attn_cls``; ``nvidia/flash_mla_mega_attn.py``: ``is_available_for``; ``sparse_mla.py`` and
``v1/attention/backends/mla/indexer.py``: the kernels' block sizes;
``v1/attention/backends/mla/sparse_swa.py``: ``DeepseekV4SWACache``; ``v1/kv_cache_interface.py``:
``CircularBufferSpec``; ``v1/core/kv_cache_utils.py``: ``_get_packed_kv_cache_groups``;
``common/engram.py``: ``Engram``, ``ParallelEngramEmbedding``;
``config/engram.py``: ``EngramConfig``). The CPU server cannot build this model (its attention asserts a
CUDA device), so the packing is checked by running vLLM's own ``_get_packed_kv_cache_groups`` on the specs
these rules give (``tests/e2e/test_deepseek_v41.py``).

**The layers.** ``compress_ratios[i]`` is 0 (a sliding window only), 1 (a full-length compressed cache) or 2
(one state per two tokens). Unlike V4, only the ``kv_source_layer_ids`` own a compressed cache, a compressor
and (where also in ``index_source_layer_ids``) the indexer's keys; the layers above a source read its caches.
So a model of 40 layers keeps:

* a **window** in every layer: the last ``sliding_window`` tokens in 32-token blocks
  (``SlidingWindowMLASpec``);
* in each **kv source**: its compressed latents, ``block // ratio`` states a block (``MLAAttentionSpec``),
  the **indexer's keys** beside them when it is an index source (132 bytes a state: 128 FP8 values and a
  float32 scale), and at ratio 2 the compressor's running state, a **ring** of ``max(8, next power of two of
  k + 2)`` float32 rows of ``2 x head_dim`` (``k`` speculative tokens) that is one block a request whatever
  its length (``CircularBufferSpec``).

**The record and block, by GPU.** With ``--kv-cache-dtype`` ``auto`` (or ``fp8``) the default backend picks
the record: on compute capability 9.x FlashMLA keeps V4's 584-byte record in 576-byte-aligned pages and
64-token blocks (the FlashMLA and indexer kernels' block); on 10.x the records are V4.1's MXFP8 ones
(528 bytes, 512-byte alignment) in 128-token blocks, and the default "mega attention" (where the tensor
parallel size divides the heads and ``o_groups`` and leaves 8 heads a group) stores the compressed latents
as NVFP4 (288 bytes: ``nvfp4_ds_mla``). 16-bit KV is refused by these backends; 12.x (FlashInfer's SM120
class) and older GPUs are not modelled (a note says so).

**The pool.** vLLM packs the caches as for V4 (:func:`sidecar.budget.deepseek_v4.pack`), but nothing
repeats here: the latents and keys stay whole in one group, and the windows and rings are *state buckets*,
split into as many groups as it takes for each to fit that group's page. DeepSeek-V4.1-Flash on an H200:
one latent group of 116,928 bytes a block (three ratio-2 and one ratio-1 source with their keys), seven
window groups of 5-6 layers and one ring group; a full-length request holds ``cdiv(max_model_len, 64)``
latent blocks, each window group's capped blocks and one ring block: about 1,827 bytes a token.

**Weights.** A layer's attention is V4's; the compressor (``fused_wkv_wgate``: ``hidden x head_dim``, twice
at ratio 2, and a norm) and the indexer (``wq_b``, ``weights_proj``, and ``wk`` with its norm in sources) live
only in the listed layers, all replicated on every tensor-parallel GPU. The n-gram ("Engram") layers add a
``wkv`` projection and two mixing vectors on the GPU; their tables (``engram_num_embeddings`` rows of
``engram_head_dim`` FP8 values and a UE8M0 scale per 32) stay in pinned host memory by default
(``EngramConfig.cpu_offload``), which ``plan`` names in a note rather than count as GPU weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sidecar.budget.deepseek_v4 import (
    NO_KERNEL_GPU_NAMES,
    CacheLayer,
    PackedPool,
    V4Attention,
    pack,
    page_bytes,
    v4_pool,
)
from sidecar.budget.dtypes import normalise_dtype
from sidecar.budget.kv_groups import KvGroups
from sidecar.units import GIB

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

SWA_BLOCK: Final = 32  # DeepseekV4SWACache(block_size=32) in V4.1's attention
INDEX_BYTES: Final = 132  # _indexer_k_cache_head_dim: 128 FP8 values and a float32 scale
BLACKWELL_NAMES: Final = ("b100", "b200", "gb200", "b300", "gb300")
"""GPU names of compute capability 10.x (data-centre Blackwell): V4.1's MXFP8 records; NVFP4 KV at head 64."""
SM12_NAMES: Final = ("5090", "5080", "5070", "5060", "rtx pro", "gb10", "spark")
"""Compute capability 12.x (GeForce RTX 50, RTX PRO Blackwell, GB10): FlashInfer's SM120 class, unmodelled."""
WV_GROUP_SIZE: Final = 8  # heads per wo_a group mega attention needs (common/ops/fused_layout.py)
ENGRAM_SCALE_BLOCK: Final = 32  # ParallelEngramEmbedding: one UE8M0 scale byte per 32 FP8 values


@dataclass(frozen=True, slots=True)
class V41Record:
    """What the default backend stores: the block, the window's and latents' record bytes, the alignment."""

    backend: str
    block: int
    window_bytes: int
    latent_bytes: int
    alignment: int


HOPPER: Final = V41Record("FlashMLA (V4 record)", 64, 584, 584, 576)


def v41_record(attention: V4Attention, heads: int, gpu: str, tensor_parallel_size: int) -> V41Record:
    """The record ``_select_dsv4_attn_cls`` leads to on ``gpu`` (capability 9.x unless 10.x by name)."""
    if not any(name in gpu.lower() for name in BLACKWELL_NAMES):
        return HOPPER
    tp, groups = tensor_parallel_size, attention.o_groups
    mega = (
        heads % tp == 0 and groups % tp == 0 and groups >= tp
        and (heads // tp) % WV_GROUP_SIZE == 0 and heads // groups == WV_GROUP_SIZE
    )  # fmt: skip
    if mega:
        return V41Record("mega attention (nvfp4_ds_mla)", 128, 528, 288, 512)
    return V41Record("FlashMLA (V4.1 MXFP8 record)", 128, 528, 528, 512)


def ring_rows(speculative_tokens: int) -> int:
    """``CompressorStateCache.block_size``: drafts, bonus token and previous row, a power of two >= 8."""
    rows = speculative_tokens + 2
    return max(8, 1 << (rows - 1).bit_length())


def v41_cache_layers(
    attention: V4Attention, record: V41Record, speculative_tokens: int = 0
) -> list[CacheLayer]:
    """Every cache a V4.1 model registers: each layer's window, and each source's latents, keys and ring."""
    sources = set(attention.kv_sources or ())
    rows = ring_rows(speculative_tokens)
    layers: list[CacheLayer] = []
    for index, ratio in enumerate(attention.ratios):
        window_page = page_bytes(SWA_BLOCK, record.window_bytes, record.alignment)
        layers.append(CacheLayer(SWA_BLOCK, window_page, attention.window))
        if index not in sources or ratio < 1:
            continue
        states = record.block // ratio
        layers.append(
            CacheLayer(record.block, page_bytes(states, record.latent_bytes, record.alignment), None)
        )
        if index in attention.index_sources:
            layers.append(CacheLayer(record.block, page_bytes(states, INDEX_BYTES, record.alignment), None))
        if ratio > 1:
            layers.append(CacheLayer(rows, rows * 2 * attention.head_dim * 4, None, ring=True))
    return layers


def compressed_pool(request: PlanRequest) -> PackedPool | None:
    """The pool vLLM packs for DeepSeek-V4 or V4.1 (``None`` for other models)."""
    attention = request.architecture.v4
    if attention is None:
        return None
    if not attention.v41:
        return v4_pool(attention, request.kv_cache_dtype)
    record = v41_record(
        attention, request.architecture.num_attention_heads, request.gpu, request.tensor_parallel_size
    )
    drafts = request.speculative.num_speculative_tokens if request.speculative else 0
    return pack(v41_cache_layers(attention, record, drafts))


def v41_layer_parameters(attention: V4Attention, hidden: int, heads: int, layer: int) -> int:
    """A V4.1 layer's parameters as vLLM 0.32.0 builds them.

    V4's attention and hyper-connection mixers (``attn_hc``, ``ffn_hc``), the compressor and indexer where
    the layer has them, and its n-gram projection.
    """
    total = attention.layer_parameters(hidden, heads, 1)  # V4's attention and mixers, no compressor
    total += v41_replicated_extras(attention, hidden, layer)
    if layer in attention.engram_layers:  # wkv, q_weight, k_weight (the table stays on the host)
        width = attention.engram_columns * attention.engram_width
        total += width * hidden * (attention.hc_mult + 1) + 2 * attention.hc_mult * hidden
    return total


def v41_replicated_extras(attention: V4Attention, hidden: int, layer: int) -> int:
    """A layer's compressor and indexer (``disable_tp`` and ``ReplicatedLinear``: whole on every GPU)."""
    ratio = attention.ratios[layer] if layer < len(attention.ratios) else 0
    source = layer in (attention.kv_sources or ())
    total = 0
    if source and ratio >= 1:  # fused_wkv_wgate (no gate at ratio 1) and its norm
        total += hidden * attention.head_dim * (2 if ratio > 1 else 1) + attention.head_dim
    if layer in attention.index_sources and ratio >= 1:
        index = attention.index_heads * attention.index_head_dim
        total += attention.q_lora_rank * index + hidden * attention.index_heads  # wq_b, weights_proj
        if source:  # wk from the source's latent, and its norm
            total += attention.head_dim * attention.index_head_dim + attention.index_head_dim
    return total


def engram_host_bytes(attention: V4Attention) -> int:
    """The n-gram tables in pinned host memory: a row of FP8 values and a UE8M0 scale per 32, per table."""
    width = attention.engram_width
    return sum(rows * (width + width // ENGRAM_SCALE_BLOCK) for rows in attention.engram_rows)


@dataclass(frozen=True, slots=True)
class V4Terms:
    """The ledger's KV terms for DeepSeek-V4 and V4.1 (bytes per GPU; every cache is replicated across TP)."""

    per_token: float  # what a token adds beyond the windows (PackedPool.bytes_per_token)
    per_sequence: float  # a full-length request's blocks at the pool's stride
    stride: int  # bytes one block id costs: what the pool is divided by
    request_blocks: int  # blocks a full-length request holds over every group
    groups: KvGroups  # one full group and the windowed ones: vLLM logs concurrency x max_model_len tokens
    block: int  # the latents' block: the one vLLM's scheduler and metrics report


def v4_terms(request: PlanRequest) -> V4Terms | None:
    """:class:`V4Terms` for ``request``'s model, ``None`` unless it is a DeepSeek-V4 or V4.1."""
    pool = compressed_pool(request)
    if pool is None:
        return None
    blocks = pool.blocks_per_request(request.effective_max_model_len, request.in_flight_tokens)
    groups = KvGroups(full=1, sliding=len(pool.groups) - 1)
    latent = next(g.block for g in pool.groups if g.window is None and not g.ring)
    return V4Terms(pool.bytes_per_token, blocks * pool.stride, pool.stride, blocks, groups, latent)


def v4_notes(request: PlanRequest) -> tuple[str, ...]:
    """What ``plan`` says of DeepSeek-V4's or V4.1's pool beyond its table (none for other models)."""
    attention, pool = request.architecture.v4, compressed_pool(request)
    if attention is None or pool is None:
        return ()
    length, in_flight = request.effective_max_model_len, request.in_flight_tokens
    blocks = pool.blocks_per_request(length, in_flight)
    growing = sum(
        g.blocks_per_request(length, in_flight) for g in pool.groups if g.window is None and not g.ring
    )
    name, gpu = ("DeepSeek-V4.1" if attention.v41 else "DeepSeek-V4"), request.gpu.lower()
    notes = []
    if any(part in gpu for part in NO_KERNEL_GPU_NAMES):
        notes.append(
            f"vLLM 0.32 runs {name}'s sparse attention on compute capability 9.x and 10.x (FlashMLA) "
            f"or 12.x (FlashInfer) only: {request.gpu} has no kernel for it, so the engine cannot serve this "
            "model there (the figures are what its pool would be)"
        )
    dtype = normalise_dtype(request.kv_cache_dtype)
    if attention.v41:
        notes.extend(_v41_notes(attention, request, gpu, dtype))
    elif dtype in {"bf16", "fp16"}:
        notes.append(
            "DeepSeek-V4 with 16-bit KV: vLLM's default backend (FlashMLA) keeps fp8_ds_mla only and refuses "
            "to start (_resolve_dsv4_kv_cache_dtype); bf16 rows need --attention-backend "
            "FLASHINFER_MLA_SPARSE_DSV4 (Blackwell), as planned here"
        )
    notes.append(
        f"{name}: {len(pool.groups)} KV cache groups, every cache whole on each GPU; a {length:,}-token "
        f"request holds {blocks:,} blocks of {pool.stride:,} bytes, {blocks - growing:,} of them for its "
        f"{attention.window}-token windows and compressor states whatever its length "
        f"({in_flight:,} tokens in flight)"
    )
    return tuple(notes)


def _v41_notes(attention: V4Attention, request: PlanRequest, gpu: str, dtype: str) -> list[str]:
    record = v41_record(
        attention, request.architecture.num_attention_heads, request.gpu, request.tensor_parallel_size
    )
    notes = [
        f"DeepSeek-V4.1's KV records as vLLM 0.32's default backend on this GPU keeps them: {record.backend}"
    ]
    if any(part in gpu for part in SM12_NAMES):
        notes.append(
            "on compute capability 12.x vLLM runs DeepSeek-V4.1 through FlashInfer's SM120 class, whose "
            "cache records are not modelled: the figures are the Hopper ones"
        )
    if dtype in {"bf16", "fp16"}:
        notes.append(
            "DeepSeek-V4.1 with 16-bit KV: vLLM's default backends keep packed FP8 records only and refuse "
            "to start (_resolve_dsv4_kv_cache_dtype); planned with the default record"
        )
    if attention.engram_rows:
        notes.append(
            f"DeepSeek-V4.1's n-gram tables ({len(attention.engram_rows)} of them, "
            f"{engram_host_bytes(attention) / GIB:.1f} GiB) stay in pinned host memory (vLLM's "
            "EngramConfig.cpu_offload, the default): not in the GPU figures, but the pod needs that much "
            "host memory per data-parallel replica unless the replicas share it (dp_shared_memory)"
        )
    return notes
