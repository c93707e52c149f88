"""How many pool blocks a sequence of ``t`` tokens holds: the engine's KV cache groups. Pure.

Theory of operation
-------------------
vLLM's pool is one list of blocks shared by every KV cache group (:mod:`sidecar.budget.kv_groups`
says how vLLM forms them). A model whose layers all attend to every token has one group, and a
sequence of ``t`` tokens holds ``ceil(t / block_size)`` blocks. A hybrid model holds that many in each
full-attention group and, in each sliding-window group, never more than the window's cap
(``SlidingWindowManager.remove_skipped_blocks`` frees what fell out of the window;
``SlidingWindowSpec.max_admission_blocks_per_request`` caps the reservation; vLLM 0.32.0 as installed,
``vllm/v1/core/single_type_kv_cache_manager.py`` and ``vllm/v1/kv_cache_interface.py``). Planning one
group for gpt-oss, which has one of each, would count half of what it holds.

The engine says how many blocks a full-length request takes: ``cache_config_info`` reports the pool
(``num_gpu_blocks``) and ``kv_cache_max_concurrency``, which vLLM computes as the pool over the sum of
each group's blocks for ``max_model_len`` tokens (``get_max_concurrency_for_kv_cache_config``). So
the layout is read as follows:

* without the model's layer kinds, a request is planned as one group when the engine's figure is
  ``ceil(max_model_len / block_size)`` (or absent); any other figure is a layout the sidecar cannot
  split into groups, and capacity admission falls back to ``lanes`` and says why;
* with them (the prediction's ``config.json``), the groups come from the layer kinds and the window
  cap from the engine's figure (``(figure - full groups x full blocks) / sliding groups``), which holds
  whatever vLLM counts as in flight (its cap adds ``max_num_batched_tokens`` once, or twice with async
  scheduling); a figure the groups cannot explain falls back the same way. Without the engine's figure
  the cap is the prediction's (one batch in flight, as the budget computes it). Llama 4's chunked
  local-attention groups are read the same way: a sequence holds at most one chunk plus what is in flight
  in each (``ChunkedLocalAttentionSpec``, :func:`sidecar.budget.kv_groups.chunked_local_blocks`), and the
  engine's figure gives that cap (a model with both sliding and chunked groups must match the prediction).

A hybrid model's recurrent-state layers (gated DeltaNet, Mamba2: :mod:`sidecar.budget.state_layers`) form
groups of their own in which a sequence holds a fixed number of blocks whatever its length (two with prefix
caching in vLLM 0.32, three for Mamba2 mixers, one without; ``MambaSpec.max_memory_usage_bytes``); the
engine's figure gives that number the same way (``(figure - full groups x full blocks) / state groups``).

Speculative decoding changes two things (vLLM 0.32.0 as installed). A step verifies up to ``k`` draft tokens
of each running sequence, so it may give it ``k + 1`` tokens (:attr:`PoolView.tokens_per_step`); and a
running sequence holds slots past its tokens: the ``k`` drafts being verified plus the drafter's lookahead
(``VllmConfig.num_lookahead_tokens``: ``k`` for EAGLE and draft models, ``k + 1`` for DFlash, none for n-gram;
``Scheduler.schedule`` passes it to ``KVCacheManager.allocate_slots``, which allocates
``min(computed + new + lookahead, max_model_len)`` slots). The page gives ``k`` but not the method, so
:attr:`PoolView.slot_margin` takes the largest, ``2k + 1``: at most ``k + 1`` tokens more than n-gram holds.

DeepSeek-V4's pool (:mod:`sidecar.budget.deepseek_v4`) has one group of compressed latents in 256-token blocks
and windowed groups of three block sizes: its 128-token windows in 64-token blocks and its compressors'
running states in blocks of 4 and 8 tokens, each windowed group capped like a sliding window
(:class:`WindowGroups`); every cap rises with the tokens in flight, so the engine's figure gives that one
number (``sidecar.monitor.pool``).

Prefix sharing is planned only for single-group layouts: a hybrid model's cache hit needs its
sliding-window blocks too, which vLLM frees once they leave the window, so counting its full-attention
prefix blocks once could plan fewer blocks than vLLM allocates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WindowGroups:
    """Windowed KV cache groups with a block of their own (DeepSeek-V4's windows and compressor states).

    DeepSeek-V4.1's compressor rings are such groups with a cap of one block.
    """

    groups: int
    block: int  # tokens a block holds
    cap: int  # blocks a sequence holds at most in each


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """A sequence's blocks per group kind: ``full`` groups hold every token, the others a capped span."""

    full: int = 1
    sliding: int = 0
    window_cap: int = 0  # blocks a sequence holds at most in each sliding-window group
    chunked: int = 0  # Llama 4's chunked local-attention groups
    chunk_cap: int = 0  # blocks a sequence holds at most in each of them
    state: int = 0  # recurrent-state groups (gated DeltaNet, Mamba2)
    state_blocks: int = 0  # blocks a sequence holds in each of them, whatever its length
    full_block: int = 0  # tokens a full-attention group's block holds, when not ``block_size`` (Gemma 4)
    window_block: int = 0  # tokens a sliding-window group's block holds, when not ``block_size``
    windows: tuple[WindowGroups, ...] = ()  # more windowed groups, each kind with its own block and cap

    @property
    def single(self) -> bool:
        """Whether the pool has one full-attention group (blocks are tokens over the block size)."""
        return (
            self.full == 1
            and self.sliding == 0
            and self.chunked == 0
            and self.state == 0
            and not self.windows
        )

    def blocks(self, tokens: int, block_size: int) -> int:
        """Pool blocks a sequence of ``tokens`` tokens holds."""
        whole = blocks_for(tokens, block_size)
        return (
            self.full * blocks_for(tokens, self.full_block or block_size)
            + self.sliding * min(blocks_for(tokens, self.window_block or block_size), self.window_cap)
            + self.chunked * min(whole, self.chunk_cap)
            + (self.state * self.state_blocks if whole else 0)
            + sum(w.groups * min(blocks_for(tokens, w.block), w.cap) for w in self.windows)
        )

    def reserved_blocks(self, tokens: int, block_size: int) -> int:
        """The blocks vLLM plans a ``tokens``-token request for (its ``kv_cache_max_concurrency`` figure).

        A sliding group counts its whole cap, one more than the sequence holds when the window and what is in
        flight span it (``SlidingWindowSpec.max_admission_blocks_per_request``, 0.15.0 to 0.32.0).
        """
        return (
            self.blocks(tokens, block_size)
            + self.sliding * max(0, self.window_cap - blocks_for(tokens, self.window_block or block_size))
            + sum(w.groups * max(0, w.cap - blocks_for(tokens, w.block)) for w in self.windows)
        )


SINGLE_GROUP = GroupLayout()
"""One full-attention group: the layout of every model whose layers all attend to every token."""


@dataclass(frozen=True, slots=True)
class LayoutAnswer:
    """The layout admission plans with, or ``None`` and why not."""

    layout: GroupLayout | None
    why: str = ""


def engine_blocks_per_request(num_gpu_blocks: int | None, max_concurrency: float | None) -> int | None:
    """Blocks the engine plans for one full-length request (``num_gpu_blocks / kv_cache_max_concurrency``)."""
    if not num_gpu_blocks or not max_concurrency or max_concurrency <= 0:
        return None
    return round(num_gpu_blocks / max_concurrency)


def resolve_layout(
    *,
    block_size: int,
    max_model_len: int,
    engine_blocks: int | None,
    groups: tuple[int, int, int] | tuple[int, int, int, int] | None = None,
    predicted_window_cap: int | None = None,
    predicted_chunk_cap: int | None = None,
    predicted_state_blocks: int | None = None,
    group_blocks: tuple[int, int] = (0, 0),
) -> LayoutAnswer:
    """The layout from the engine's blocks per full-length request and the model's groups.

    ``groups`` counts the full-attention, sliding-window, chunked local-attention and (optionally) state
    groups. The engine's figure gives the cap of the one capped kind present; with more than one present,
    the predicted caps must explain it exactly. ``group_blocks``: the tokens a full-attention and a
    sliding-window group's block hold where vLLM unified unequal pages (0: ``block_size``).
    """
    whole = math.ceil(max_model_len / block_size)
    full_block, window_block = (0 if tokens == block_size else tokens for tokens in group_blocks)
    whole_full = math.ceil(max_model_len / (full_block or block_size))
    whole_window = math.ceil(max_model_len / (window_block or block_size))
    if groups is None:
        if engine_blocks is None or engine_blocks == whole:
            return LayoutAnswer(SINGLE_GROUP)
        return LayoutAnswer(
            None,
            f"the engine plans {engine_blocks} blocks for a {max_model_len}-token request, not {whole}: "
            "a hybrid KV layout; give the sidecar the model's config (--model) so admission reads its layers",
        )
    full, sliding, chunked, state = (*groups, 0)[:4]
    # vLLM's sliding cap: never more than the whole request and one (the window need not start a block)
    window = min(whole_window + 1, predicted_window_cap) if predicted_window_cap else whole_window
    chunk = min(whole, predicted_chunk_cap) if predicted_chunk_cap else whole
    predicted = GroupLayout(
        full, sliding, window if sliding else 0, chunked, chunk if chunked else 0,
        state, (predicted_state_blocks or 1) if state else 0, full_block, window_block,
    )  # fmt: skip
    if engine_blocks is None or engine_blocks == predicted.reserved_blocks(max_model_len, block_size):
        return LayoutAnswer(predicted)
    rest = engine_blocks - full * whole_full
    capped = [count for count in (sliding, chunked, state) if count]
    longest = (whole_window + 1) if sliding else whole  # a capped group never plans more than this
    bounded = state or rest // max(1, sum(capped)) <= longest  # a state group's blocks do not follow length
    if len(capped) == 1 and rest > 0 and rest % capped[0] == 0 and bounded:
        cap = rest // capped[0]
        read = GroupLayout(
            full, sliding, cap if sliding else 0, chunked, cap if chunked else 0,
            state, cap if state else 0, full_block, window_block,
        )  # fmt: skip
        return LayoutAnswer(read)
    return LayoutAnswer(
        None,
        f"the engine plans {engine_blocks} blocks for a {max_model_len}-token request, which {full} "
        f"full-attention, {sliding} sliding-window, {chunked} chunked-attention and {state} state KV groups "
        "do not explain; check --model",
    )


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks a sequence of ``tokens`` tokens holds."""
    return max(0, math.ceil(tokens / block_size))


@dataclass(frozen=True, slots=True)
class PoolView:
    """The engine's pool as admission sees it."""

    blocks: int
    block_size: int
    prefix_caching: bool = True
    source: str = "engine"  # engine (cache_config_info) or prediction
    layout: GroupLayout = SINGLE_GROUP  # the engine's KV cache groups
    speculative_tokens: int = 0  # draft tokens per step and sequence (0: no speculative decoding)

    @property
    def tokens_per_step(self) -> int:
        """The most tokens one engine step gives a running sequence (see the module docstring)."""
        return 1 + self.speculative_tokens

    @property
    def slot_margin(self) -> int:
        """KV slots a running sequence may hold past its tokens: drafts and the drafter's lookahead."""
        return 2 * self.speculative_tokens + 1 if self.speculative_tokens else 0

    def running_blocks(self, tokens: int, max_model_len: int) -> int:
        """Pool blocks a running sequence of ``tokens`` tokens holds, its :attr:`slot_margin` included."""
        return self.sequence_blocks(min(tokens + self.slot_margin, max_model_len))

    @property
    def shares_prefixes(self) -> bool:
        """Whether prompt blocks held by others count once: prefix caching on and one KV cache group."""
        return self.prefix_caching and self.layout.single

    def sequence_blocks(self, tokens: int) -> int:
        """Pool blocks one sequence of ``tokens`` tokens holds, over every KV cache group."""
        return self.layout.blocks(tokens, self.block_size)
