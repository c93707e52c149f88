"""The block hashes of vLLM's prefix cache, as far as admission needs them. Pure.

vLLM's prefix cache keys a full block of prompt tokens by a hash chained over every block before it
(``vllm/v1/core/kv_cache_utils.py``, ``hash_block_tokens``), so two prompts share a block only when all
tokens up to its end are equal. The sidecar keys blocks the same way (with Python's ``hash``: only equality
matters), for the ledger to count a block held by two requests once (:mod:`sidecar.admission.capacity`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sidecar.admission.geometry import PoolView


def prefix_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the prompt blocks vLLM's prefix cache can share: ``floor((n - 1) / block_size)``."""
    shareable = max(0, (len(token_ids) - 1) // block_size)
    hashes: list[int] = []
    parent = 0
    for index in range(shareable):
        parent = hash((parent, tuple(token_ids[index * block_size : (index + 1) * block_size])))
        hashes.append(parent)
    return tuple(hashes)


def prompt_hashes(prompt_ids: Iterable[Sequence[int]] | None, pool: PoolView) -> tuple[tuple[int, ...], ...]:
    """Each prompt's shareable block hashes: only with exact token ids and prefix caching on."""
    if prompt_ids is None or not pool.shares_prefixes:
        return ()
    return tuple(prefix_hashes(ids, pool.block_size) for ids in prompt_ids)
