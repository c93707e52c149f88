"""The KV pool capacity admission plans against, and why there is none when there is none.

The engine's ``cache_config_info`` gives the pool (``num_gpu_blocks`` per data-parallel engine, one block
kept null by vLLM) and its blocks per full-length request; the prediction's ``config.json`` gives the
layer kinds that split those blocks into KV cache groups (:mod:`sidecar.admission.geometry`). Before the
engine reports a pool, the prediction's is used (vLLM's memory arithmetic, so only for vLLM). The page's
speculative tokens (:data:`sidecar.signals.vllm.SPEC_POSITIONS`) say how fast sequences may grow.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sidecar.admission.geometry import (
    GroupLayout,
    LayoutAnswer,
    PoolView,
    WindowGroups,
    engine_blocks_per_request,
    resolve_layout,
)
from sidecar.budget.deepseek_v4 import PackedPool
from sidecar.budget.deepseek_v41 import compressed_pool
from sidecar.budget.kv_groups import chunked_local_blocks, kv_groups, sliding_window_blocks
from sidecar.budget.kv_terms import kv_pages, layer_kv_bytes_per_token, state_terms
from sidecar.budget.layer_kinds import LayerKind
from sidecar.monitor.monitor import Monitor
from sidecar.signals.kinds import EngineKind


def usable_blocks(num_gpu_blocks: int) -> int:
    """Blocks requests can hold: vLLM keeps one null block (``BlockPool.get_usage`` divides by n - 1)."""
    return max(1, num_gpu_blocks - 1)


@dataclass(frozen=True, slots=True)
class PoolAnswer:
    """The pool, or ``None`` and the reason (what ``/status`` says of the fallback)."""

    view: PoolView | None
    why: str = ""


def _layout(monitor: Monitor, block_size: int, engine_blocks: int | None) -> LayoutAnswer:
    max_model_len = monitor.request_max_model_len()
    if max_model_len is None:
        return LayoutAnswer(None, "no max_model_len known yet (the engine's /v1/models, or --max-model-len)")
    request = monitor.request
    if request is None:
        return resolve_layout(block_size=block_size, max_model_len=max_model_len, engine_blocks=engine_blocks)
    arch = request.architecture
    pool = compressed_pool(request)  # DeepSeek-V4, V4.1: windows, states and compressed latents
    if pool is not None:
        return _v4_layout(pool, max_model_len, engine_blocks, request.in_flight_tokens)
    groups = kv_groups(arch.kv_kinds)
    window, chunk, in_flight = arch.sliding_window, arch.attention_chunk_size, request.in_flight_tokens
    per_layer = layer_kv_bytes_per_token(request)
    state, pages = state_terms(request, per_layer), kv_pages(request, arch.kv_kinds, per_layer, block_size)
    full_block, window_block = pages.blocks[LayerKind.FULL], pages.blocks[LayerKind.SLIDING]
    return resolve_layout(
        block_size=block_size,
        max_model_len=max_model_len,
        engine_blocks=engine_blocks,
        groups=(groups.full, groups.sliding, groups.chunked, groups.state),
        predicted_state_blocks=state.blocks_per_group if state else None,
        group_blocks=(full_block, window_block),
        predicted_window_cap=sliding_window_blocks(window, in_flight, max_model_len, window_block)
        if window
        else None,
        predicted_chunk_cap=chunked_local_blocks(chunk, in_flight, max_model_len, block_size)
        if chunk
        else None,
    )


def admission_pool(monitor: Monitor) -> PoolAnswer:
    """The pool admission plans against: the engine's blocks, else the prediction's."""
    snapshot = monitor.engine.snapshot
    config = snapshot.cache_config if snapshot is not None else None
    if snapshot is not None and config is not None and config.num_gpu_blocks and config.block_size:
        engine_blocks = engine_blocks_per_request(config.num_gpu_blocks, config.kv_cache_max_concurrency)
        layout = _layout(monitor, config.block_size, engine_blocks)
        if layout.layout is None:
            return PoolAnswer(None, layout.why)
        return PoolAnswer(
            PoolView(
                blocks=usable_blocks(config.num_gpu_blocks) * max(1, len(snapshot.engines)),
                block_size=config.block_size,
                prefix_caching=config.enable_prefix_caching is not False,
                source="engine",
                layout=layout.layout,
                speculative_tokens=snapshot.speculative_tokens,
            )
        )
    if snapshot is not None and snapshot.kind is not EngineKind.VLLM:
        return PoolAnswer(
            None,
            f"the {snapshot.kind} page reports no KV pool in blocks (the prediction is vLLM's arithmetic)",
        )
    ledger = monitor.ledger
    if ledger is None or not ledger.kv_pool_blocks:
        why = "the engine's page has not been read yet" if snapshot is None else "no KV pool known yet"
        return PoolAnswer(None, f"{why} (the engine's cache config, or a prediction)")
    block_size = ledger.block_size
    layout = _layout(monitor, block_size, None)
    if layout.layout is None:
        return PoolAnswer(None, layout.why)
    return PoolAnswer(
        PoolView(
            blocks=usable_blocks(ledger.kv_pool_blocks) * ledger.request.data_parallel_size,  # per engine
            block_size=block_size,
            source="prediction",
            layout=layout.layout,
        )
    )


def _v4_layout(
    pool: PackedPool, max_model_len: int, engine_blocks: int | None, in_flight: int
) -> LayoutAnswer:
    """DeepSeek-V4's groups (:mod:`sidecar.budget.deepseek_v4`): its latents' whole, its windowed ones capped.

    Every cap rises with the tokens vLLM counts in flight, so the engine's blocks per full-length request give
    that number: the fewest tokens in flight whose caps reach the engine's figure, which must then match it.
    Without the engine's figure, the prediction's tokens in flight.
    """
    latents = [group for group in pool.groups if group.window is None and not group.ring]
    kinds = Counter((group.block, group.window) for group in pool.groups if group.window is not None)
    rings = Counter(group.block for group in pool.groups if group.ring)  # V4.1: one block a request

    def at(tokens: int) -> GroupLayout:
        windows = tuple(
            WindowGroups(count, block, sliding_window_blocks(window, tokens, max_model_len, block))
            for (block, window), count in kinds.items()
            if window is not None
        ) + tuple(WindowGroups(count, block, 1) for block, count in rings.items())
        return GroupLayout(full=len(latents), full_block=latents[0].block, windows=windows)

    if engine_blocks is None:
        return LayoutAnswer(at(in_flight))
    low, high = 0, max_model_len
    while low < high:
        middle = (low + high) // 2
        low, high = (
            (middle + 1, high)
            if at(middle).reserved_blocks(max_model_len, 1) < engine_blocks
            else (low, middle)
        )
    if at(low).reserved_blocks(max_model_len, 1) == engine_blocks:
        return LayoutAnswer(at(low))
    return LayoutAnswer(
        None,
        f"the engine plans {engine_blocks} blocks for a {max_model_len}-token request, which DeepSeek-V4's "
        f"{len(pool.groups)} KV cache groups do not explain at any number of tokens in flight; check --model",
    )
