"""DeepSeek-V4's compressed attention as vLLM 0.32.0 caches it: five kinds of cache in one packed pool. Pure.

Read in vLLM 0.32.0 as installed (``vllm/models/deepseek_v4/attention.py``: ``DeepseekV4Attention``,
``DeepseekV4Indexer``, ``DeepseekV4IndexerCache``; ``compressor.py``: ``CompressorStateCache``;
``vllm/v1/attention/backends/mla/sparse_swa.py``: ``DeepseekV4SWACache``; ``vllm/v1/kv_cache_interface.py``:
``AttentionSpec``, ``SlidingWindowSpec``, ``UniformTypeKVCacheSpecs``; ``vllm/v1/core/kv_cache_utils.py``:
``_get_packed_kv_cache_groups``, ``_get_kv_cache_bytes_per_block``,
``get_max_concurrency_for_kv_cache_config``) and checked on the real CPU server
(``tests/e2e/test_deepseek_v4.py``: the groups, their pages and the blocks, exactly).

**The layers.** ``compress_ratios[i]`` (the published config.json; transformers 5 writes ``layer_types`` and
``compress_rates`` instead, read the same way) gives each decoder layer a ratio: 0 or 1, a sliding window
only; 4 ("compressed sparse attention", with a lightning indexer); 128 ("heavily compressed attention").
Each layer caches:

* **its window**: the last ``sliding_window`` tokens (128) of one 512-value latent, in 64-token blocks
  (``SlidingWindowMLASpec``);
* **its compressed latents** (ratio 4 or 128): one 512-value state per ``ratio`` tokens, in blocks of
  ``block_size`` tokens (``MLAAttentionSpec``, ``tokens_per_state``), and with ratio 4 the **indexer's keys**
  beside them: one ``index_head_dim`` state per 4 tokens, FP8 with a float32 scale per 128 values (132 bytes)
  or MXFP4 (68);
* **the compressors' running states** (float32, ``2 x coff x head_dim`` values a token with ``coff`` 2 at
  ratio 4, else 1), which behave as sliding windows of ``coff x ratio`` tokens in blocks of 4 tokens (ratio
  4: the attention's and the indexer's) or 8 (ratio 128).

A state is 584 bytes in the default ``fp8_ds_mla`` format (448 FP8 values, 64 bf16 RoPE values, 8 scale
bytes; ``--kv-cache-dtype`` ``auto`` and every ``fp8`` spelling), and pages are padded to 576 bytes; backends
that keep plain rows store 512 values in bf16 or per-tensor FP8 and pad to 512 bytes. Every cache is
replicated on each tensor-parallel GPU (``max_tp_shards=1``).

**The pool.** Pages differ, so vLLM packs them (``_get_packed_kv_cache_groups``): layers of one kind (same
block size, and the same window for sliding ones) form a bucket; a bucket whose page sizes occur equally
often is a repeating pattern that may be split into groups of ``repeats`` pattern repeats, ``repeats`` chosen
by ``_approximate_gcd`` (the least padding, at least the largest mixed bucket's count; ties go to the larger);
other buckets stay whole, but a state bucket (rings; windows when nothing repeats: DeepSeek-V4.1) is split
into as many groups as it takes for each to fit the widest other group's page. A group's page is the sum of
its layers' pages, every group draws block ids from one shared pool, and one block id costs the largest
group page (the pool's stride). A full-length request
holds ``cdiv(max_model_len, block)`` blocks in a full-attention group and
``cdiv(min(window - 1 + in-flight tokens, max_model_len), block) + 1`` in a windowed one
(:func:`sidecar.budget.kv_groups.sliding_window_blocks`), summed over the groups: the concurrency vLLM logs
is the pool's blocks over that sum, and "KV cache size" is that concurrency times ``max_model_len``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from sidecar.budget.config_fields import first_int
from sidecar.budget.dtypes import normalise_dtype
from sidecar.budget.kv_groups import sliding_window_blocks
from sidecar.budget.quantization import expert_dtype

V4_TYPES: Final = frozenset({"deepseek_v4"})
V41_TYPES: Final = frozenset({"deepseek_v41", "deepseek_v41_text"})  # :mod:`sidecar.budget.deepseek_v41`
BLOCK_SIZE: Final = 256  # the only kernel block of the sparse-MLA and indexer backends (GPU and CPU alike)
SWA_BLOCK: Final = 64  # DeepseekV4SWACache's block_size
STATE_BYTES_DS_MLA: Final = 584  # fp8_ds_mla: 448 FP8 + 64 bf16 RoPE values + 8 scale bytes
ALIGN_DS_MLA: Final = 576
ALIGN_PLAIN: Final = 512
INDEXER_FP8_BYTES: Final = 132  # 128 FP8 values and one float32 scale per 128
INDEXER_MXFP4_BYTES: Final = 68  # 64 bytes of packed pairs and one UE8M0 byte per 32 values
_STATE_BLOCK: Final = {4: 4, 128: 8}  # CompressorStateCache.block_size by ratio
_FLOAT32: Final = 4
_LAYER_TYPE_RATIOS: Final = {"sliding_attention": 1}  # transformers 5's layer_types beside compress_rates
NO_KERNEL_GPU_NAMES: Final = ("v100", "t4", "a100", "a10", "a30", "a40", "a6000", "3090", "4090", "l4", "l20")
"""GPUs of compute capability 7.x and 8.x: vLLM 0.32 has no DeepSeek-V4 attention for them.

``DeepseekV4FlashMLABackend.supports_compute_capability``: ``major in [9, 10]``
(``vllm/models/deepseek_v4/sparse_mla.py``); 12.x takes FlashInfer's SM120 class (``_select_dsv4_attn_cls``,
``vllm/models/deepseek_v4/nvidia/model.py``). Community forks add 8.9; upstream 0.32 does not."""


@dataclass(frozen=True, slots=True)
class V4Attention:
    """DeepSeek-V4's attention as its config gives it (see the module docstring)."""

    ratios: tuple[int, ...]  # per decoder layer: 1 (window only), 4 or 128; V4.1: 0 (window only), 1 or 2
    head_dim: int  # the latent a state holds (512)
    index_head_dim: int  # the indexer's keys (128)
    window: int  # sliding_window
    q_lora_rank: int = 1024
    o_lora_rank: int = 1024
    o_groups: int = 8
    index_heads: int = 64
    hc_mult: int = 4  # hyper-connections: streams of the residual
    mxfp4_experts: bool = True  # expert_dtype "fp4" (vLLM's default when absent): MXFP4 experts under FP8
    kv_sources: tuple[int, ...] | None = None  # V4.1: the layers that own a compressed cache (None: V4)
    index_sources: tuple[int, ...] = ()  # V4.1: the layers that run an indexer
    engram_layers: tuple[int, ...] = ()  # V4.1: the layers with n-gram tables (sidecar.budget.deepseek_v41)
    engram_rows: tuple[int, ...] = ()  # their tables' rows (engram_num_embeddings)
    engram_width: int = 0  # a row's values (engram_head_dim) ...
    engram_columns: int = 0  # ... and the hashes a token looks up: (max n-gram - 1) x engram_n_heads

    @property
    def v41(self) -> bool:
        """Whether this is DeepSeek-V4.1's layout (compressed caches shared from ``kv_sources``)."""
        return self.kv_sources is not None

    def layer_parameters(self, hidden: int, heads: int, ratio: int) -> int:
        """A layer's attention, compressors, indexer and hyper-connections, as transformers 5.19 builds them.

        ``DeepseekV4Attention``: ``q_a`` (with its norm) and ``q_b`` through ``q_lora_rank``, one 512-wide
        ``kv_proj`` and norm, a grouped output (``o_a`` per ``o_groups``, ``o_b``), a sink per head; a
        compressor where ``ratio`` > 1 (``kv_proj`` and ``gate_proj`` to ``coff x head_dim``, a position
        bias of ``ratio`` rows, a norm); the indexer at ratio 4 (``q_b`` to ``index_heads x
        index_head_dim``, its own compressor at ``index_head_dim``, ``weights_proj``); two hyper-connection
        mixers (``attn_hc``, ``ffn_hc``) of ``hc_mult x hidden`` inputs and ``hc_mult x (2 + hc_mult)``
        outputs, a bias and 3 scales each.
        """
        query = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * self.head_dim
        output = heads * self.head_dim * self.o_lora_rank + self.o_groups * self.o_lora_rank * hidden
        total = query + hidden * self.head_dim + self.head_dim + output + heads
        if ratio > 1:
            total += _compressor_parameters(hidden, self.head_dim, ratio)
        if ratio == 4:
            index = self.index_heads * self.index_head_dim
            total += self.q_lora_rank * index + hidden * self.index_heads
            total += _compressor_parameters(hidden, self.index_head_dim, ratio)
        mix = self.hc_mult * (2 + self.hc_mult)
        return total + 2 * (self.hc_mult * hidden * mix + mix + 3)

    def replicated_parameters(self, hidden: int, ratio: int) -> int:
        """What of a layer vLLM 0.32.0 keeps whole on every tensor-parallel GPU.

        ``fused_wqa_wkv`` and its norms, the compressors (``fused_wkv_wgate``: ``disable_tp``) and the
        indexer's ``wq_b`` and ``weights_proj`` (``ReplicatedLinear``); the attention's ``wq_b``, ``wo_a``
        and ``wo_b`` are split.
        """
        total = hidden * (self.q_lora_rank + self.head_dim) + self.q_lora_rank + self.head_dim
        if ratio > 1:
            total += _compressor_parameters(hidden, self.head_dim, ratio)
        if ratio == 4:
            total += self.q_lora_rank * self.index_heads * self.index_head_dim + hidden * self.index_heads
            total += _compressor_parameters(hidden, self.index_head_dim, ratio)
        return total

    def head_parameters(self, hidden: int) -> int:
        """The hyper-connection head before the final norm (``hc_head``: weights, bias, scale)."""
        return self.hc_mult * hidden * self.hc_mult + self.hc_mult + 1


def _compressor_parameters(hidden: int, head_dim: int, ratio: int) -> int:
    width = (2 if ratio == 4 else 1) * head_dim  # coff x head_dim: ratio 4 compresses overlapping windows
    return 2 * hidden * width + ratio * width + head_dim  # kv_proj, gate_proj, position bias, kv_norm


def v4_attention(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> V4Attention | None:
    """DeepSeek-V4's or V4.1's compressed attention if ``cfg`` is one (defaults filled), else ``None``."""
    if model_type in V41_TYPES:
        return _v41_attention(cfg, num_layers)
    if model_type not in V4_TYPES:
        return None
    ratios = cfg.get("compress_ratios")
    if not isinstance(ratios, list):
        rates, types = cfg.get("compress_rates"), cfg.get("layer_types")
        if not isinstance(rates, Mapping) or not isinstance(types, list):
            return None
        ratios = [rates.get(kind, _LAYER_TYPE_RATIOS.get(kind, 1)) for kind in types]
    per_layer = tuple(max(1, int(r)) for r in ratios[:num_layers]) + (1,) * max(0, num_layers - len(ratios))
    return replace(_geometry(cfg), ratios=per_layer, mxfp4_experts=cfg.get("expert_dtype", "fp4") == "fp4")


def _geometry(cfg: Mapping[str, Any]) -> V4Attention:
    """The attention's sizes, V4's and V4.1's alike, with ``DeepseekV4Config``'s defaults (no layers yet)."""
    return V4Attention(
        ratios=(),
        head_dim=first_int(cfg, "head_dim") or 512,
        index_head_dim=first_int(cfg, "index_head_dim") or 128,
        window=first_int(cfg, "sliding_window") or 128,
        q_lora_rank=first_int(cfg, "q_lora_rank") or 1024,
        o_lora_rank=first_int(cfg, "o_lora_rank") or 1024,
        o_groups=first_int(cfg, "o_groups") or 8,
        index_heads=first_int(cfg, "index_n_heads") or 64,
        hc_mult=first_int(cfg, "hc_mult") or 1,
    )


def _ints(cfg: Mapping[str, Any], key: str) -> tuple[int, ...]:
    values = cfg.get(key)
    return tuple(int(v) for v in values) if isinstance(values, list) else ()


def _v41_attention(cfg: Mapping[str, Any], num_layers: int) -> V4Attention:
    """DeepSeek-V4.1 (``DeepseekV41Config``, vLLM 0.32.0): ratios 0, 1 or 2 as published, past the list 0."""
    ratios = _ints(cfg, "compress_ratios")[:num_layers]
    return replace(
        _geometry(cfg),
        ratios=ratios + (0,) * (num_layers - len(ratios)),
        mxfp4_experts=expert_dtype(cfg, "fp4") == "fp4",
        kv_sources=tuple(i for i in _ints(cfg, "kv_source_layer_ids") if i < num_layers),
        index_sources=tuple(i for i in _ints(cfg, "index_source_layer_ids") if i < num_layers),
        engram_layers=_ints(cfg, "engram_layer_ids"),
        engram_rows=_ints(cfg, "engram_num_embeddings"),
        engram_width=first_int(cfg, "engram_head_dim") or 0,
        engram_columns=max(0, (first_int(cfg, "engram_max_ngram_size") or 1) - 1)
        * (first_int(cfg, "engram_n_heads") or 0),
    )


@dataclass(frozen=True, slots=True)
class CacheLayer:
    """One layer's cache as vLLM specifies it: tokens a block holds, bytes a block takes, window if any."""

    block: int
    page: int
    window: int | None  # None: full attention (every token kept, compressed or not)
    ring: bool = False  # a ring of one block per request whatever its length (CircularBufferSpec)


def page_bytes(states: int, state_bytes: int, alignment: int) -> int:
    """``states`` records of ``state_bytes``, padded to ``alignment`` (``_apply_alignment_padding``)."""
    return -(-states * state_bytes // alignment) * alignment


def cache_layers(
    attention: V4Attention, *, block_size: int, kv_cache_dtype: str, indexer_fp4: bool
) -> list[CacheLayer]:
    """Every cache the model registers, in vLLM's order (each layer: window, latents, indexer, states).

    ``kv_cache_dtype``: ``fp8_ds_mla`` (the default), ``bf16`` or ``fp8`` (plain-row backends).
    """
    packed = kv_cache_dtype == "fp8_ds_mla"
    state_bytes = {"fp8_ds_mla": STATE_BYTES_DS_MLA, "fp8": attention.head_dim}.get(
        kv_cache_dtype, 2 * attention.head_dim
    )
    align = ALIGN_DS_MLA if packed else ALIGN_PLAIN
    index_bytes = INDEXER_MXFP4_BYTES if indexer_fp4 else INDEXER_FP8_BYTES
    layers: list[CacheLayer] = []
    for ratio in attention.ratios:
        layers.append(CacheLayer(SWA_BLOCK, page_bytes(SWA_BLOCK, state_bytes, align), attention.window))
        if ratio == 1:
            continue
        layers.append(CacheLayer(block_size, page_bytes(block_size // ratio, state_bytes, align), None))
        coff = 2 if ratio == 4 else 1
        state_block = _STATE_BLOCK[ratio]
        compressors = [attention.head_dim]
        if ratio == 4:
            layers.append(CacheLayer(block_size, page_bytes(block_size // 4, index_bytes, align), None))
            compressors.append(attention.index_head_dim)
        for head_dim in compressors:
            page = page_bytes(state_block, 2 * coff * head_dim * _FLOAT32, align)
            layers.append(CacheLayer(state_block, page, coff * ratio))
    return layers


@dataclass(frozen=True, slots=True)
class PackedGroup:
    """One KV cache group: its block, window and page (its layers' pages summed)."""

    block: int
    window: int | None
    page: int
    ring: bool = False  # one block per request whatever its length

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks a full-length request holds in this group."""
        if self.ring:
            return 1
        if self.window is None:
            return math.ceil(max_model_len / self.block)
        return sliding_window_blocks(self.window, in_flight_tokens, max_model_len, self.block)


@dataclass(frozen=True, slots=True)
class PackedPool:
    """The groups vLLM packs the caches into, and the bytes one block id costs (the largest group page)."""

    groups: tuple[PackedGroup, ...]
    stride: int

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks a full-length request holds over every group."""
        return sum(g.blocks_per_request(max_model_len, in_flight_tokens) for g in self.groups)

    @property
    def bytes_per_token(self) -> float:
        """What a token adds beyond the windows: the full-attention groups' pages over their blocks."""
        return sum(g.page / g.block for g in self.groups if g.window is None and not g.ring)


def approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """``_approximate_gcd``: the divisor from ``lower_bound`` up that pads ``values`` least (ties: larger)."""
    best, best_pad = lower_bound, None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def pack(layers: Sequence[CacheLayer]) -> PackedPool:
    """The groups and stride ``_get_packed_kv_cache_groups`` gives these caches (see the module docstring).

    A state bucket (rings, and windows when nothing repeats: V4.1) is split into as many groups as it takes
    for each to fit the widest other group's page ("cap a state group at the states a block already fits").
    Without ratio-4 layers DeepSeek-V4 has no mixed bucket to repeat, and vLLM 0.32.0 refuses to start
    (``NotImplementedError``: "page size is not divisible by the maximum page size", on the CPU server); every
    published DeepSeek-V4 has them.
    """
    buckets: dict[tuple[int, int | None, bool], Counter[int]] = {}  # (block, window, ring): layers per page
    for layer in layers:
        buckets.setdefault((layer.block, layer.window, layer.ring), Counter())[layer.page] += 1
    balanced = {key: len(set(pages.values())) == 1 for key, pages in buckets.items()}
    floor = max((max(p.values()) for k, p in buckets.items() if balanced[k] and len(p) > 1), default=0)
    repeats = (
        approximate_gcd([max(p.values()) for k, p in buckets.items() if balanced[k]], floor) if floor else 0
    )

    def split_of(key: tuple[int, int | None, bool]) -> int:
        return math.ceil(max(buckets[key].values()) / repeats) if balanced[key] and repeats else 1

    def is_state(key: tuple[int, int | None, bool]) -> bool:
        return key[2] or (not repeats and key[1] is not None)

    def widest(pages: Counter[int], split: int) -> int:
        return sum(math.ceil(count / split) * size for size, count in pages.items())

    anchor = max(widest(p, sum(p.values()) if is_state(k) else split_of(k)) for k, p in buckets.items())
    groups: list[PackedGroup] = []
    for (block, window, ring), pages in buckets.items():
        split = split_of((block, window, ring))
        if is_state((block, window, ring)):
            states_per_block = max(anchor // next(iter(pages)), 1)
            split = max(split, math.ceil(sum(pages.values()) / states_per_block))
        repeated = max(pages.values())
        for i in range(split):  # group i takes repeats i, i + split, ...: one layer of each page size each
            share = len(range(i, repeated, split))
            page = sum((share if split > 1 else count) * size for size, count in pages.items())
            groups.append(PackedGroup(block, window, page, ring))
    return PackedPool(tuple(groups), max(g.page for g in groups))


def v4_pool(attention: V4Attention, kv_cache_dtype: str) -> PackedPool:
    """The pool vLLM 0.32.0 packs for ``attention`` on a GPU (and on the CPU server alike).

    ``--kv-cache-dtype`` ``auto`` and every FP8 spelling give the default backends' ``fp8_ds_mla`` (Hopper and
    Blackwell: ``_resolve_dsv4_kv_cache_dtype``); bf16 rows are what FlashInfer's sparse backend keeps (the
    default FlashMLA one refuses them). The indexer's cache is FP8 unless ``indexer_kv_dtype`` says
    ``mxfp4`` (``AttentionConfig``, default ``auto``: FP8).
    """
    plain = normalise_dtype(kv_cache_dtype) in {"bf16", "fp16"}
    layers = cache_layers(
        attention, block_size=BLOCK_SIZE, kv_cache_dtype="bf16" if plain else "fp8_ds_mla", indexer_fp4=False
    )
    return pack(layers)
