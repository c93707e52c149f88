"""vLLM's KV cache groups: how a model's attention layers share the pool's blocks. Pure.

A model whose layers all attend the same way has one group: one block holds ``block_size`` tokens of
every layer. A hybrid model (full attention beside sliding-window attention: gpt-oss, Gemma 2 and 3,
Llama-style ``layer_types``) has several, each with a block table of its own drawn from one shared
pool, so a request holds blocks in every group (vLLM 0.32.0 as installed here:
``vllm/v1/core/kv_cache_utils.py``, ``_get_kv_cache_groups_uniform_page_size`` forms the groups and
``get_max_concurrency_for_kv_cache_config`` sums a request's blocks over them). The real CPU server
agrees: a two-layer model with one full and one sliding layer logs "kv cache group sizes (128, 128)"
and reports ``kv_cache_max_concurrency`` as its blocks over 12 per full-length request (8 full + 4
sliding, ``tests/e2e/test_hybrid_layout.py``).

A hybrid model's recurrent-state layers (gated DeltaNet, Mamba2: ``LayerKind.STATE``) are grouped the
same way: Qwen3-Next's 36 DeltaNet and 12 attention layers make three state groups and one attention group
of 12 (its blocks and page sizes: :mod:`sidecar.budget.state_layers`).

Llama 4's chunked local attention layers form groups of their own beside its full-attention (NoPE) layers:
``ChunkedLocalAttentionSpec`` (``vllm/v1/kv_cache_interface.py``, 0.32.0) is a spec type apart, so Scout's
36 chunked and 12 full layers make four groups of 12 (the 0.19.0 log on the calibration table:
``num_gpu_blocks // 4 x 16`` tokens), and a request holds at most
``cdiv(min(attention_chunk_size + in_flight, max_model_len), block)`` blocks in a chunked group
(:func:`chunked_local_blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.budget.layer_kinds import LayerKind

BALANCED_GROUP_RATIO = 1.5
"""Below this ratio of the larger layer count to the smaller, groups are as large as the larger count.

``_get_kv_cache_groups_uniform_page_size``: gpt-oss-20b with an EAGLE drafter (12 sliding, 13 full
layers) is padded to 13 + 13 rather than split into 12 + 24."""


_GROUPED = (LayerKind.FULL, LayerKind.SLIDING, LayerKind.CHUNKED, LayerKind.STATE)


@dataclass(frozen=True, slots=True)
class KvGroups:
    """How many KV cache groups hold full-attention, sliding-window, chunked and state layers."""

    full: int
    sliding: int
    layers_per_group: int = 1  # layers one block covers (padding included)
    chunked: int = 0
    state: int = 0  # recurrent-state layers (sidecar.budget.state_layers): a page per layer, not per token

    @property
    def hybrid(self) -> bool:
        """Whether a request holds blocks in groups of more than one kind."""
        return sum(1 for count in (self.full, self.sliding, self.chunked, self.state) if count) > 1


def kv_groups(kinds: Sequence[LayerKind]) -> KvGroups:
    """The groups vLLM forms for these layers (one window size; layers without KV are left out).

    Layers of one kind form one group when only one kind is present; otherwise each kind is split into
    groups of the smallest kind's layer count (padding the last), as vLLM does for the ``n:1`` patterns of
    every open hybrid model.
    """
    counts = [sum(1 for kind in kinds if kind is wanted) for wanted in _GROUPED]
    present = [count for count in counts if count]
    if len(present) <= 1:
        full, sliding, chunked, state = (1 if count else 0 for count in counts)
        return KvGroups(full, sliding, layers_per_group=max(1, sum(counts)), chunked=chunked, state=state)
    small, large = min(present), max(present)
    size = large if large < small * BALANCED_GROUP_RATIO else small
    full, sliding, chunked, state = (math.ceil(count / size) for count in counts)
    return KvGroups(full, sliding, layers_per_group=size, chunked=chunked, state=state)


def sliding_window_blocks(window: int, in_flight_tokens: int, max_model_len: int, block_size: int) -> int:
    """Blocks one sequence holds at most in a sliding-window group.

    ``SlidingWindowSpec.max_admission_blocks_per_request`` (``vllm/v1/kv_cache_interface.py``, 0.32.0):
    the window's last ``window - 1`` tokens plus the tokens in flight, never more than ``max_model_len``,
    plus one block because the window need not start at a block boundary. vLLM sizes the pool and caps a
    request's reservation with the same figure.
    """
    return math.ceil(min(window - 1 + in_flight_tokens, max_model_len) / block_size) + 1


def chunked_local_blocks(chunk: int, in_flight_tokens: int, max_model_len: int, block_size: int) -> int:
    """Blocks one sequence holds at most in a chunked local-attention group.

    ``ChunkedLocalAttentionSpec.max_admission_blocks_per_request`` (``vllm/v1/kv_cache_interface.py``,
    0.32.0): one chunk plus the tokens in flight, never more than ``max_model_len`` (no extra block: a chunk
    starts at a multiple of the chunk size). Pool sizing and admission use the same figure.
    """
    return math.ceil(min(chunk + in_flight_tokens, max_model_len) / block_size)
