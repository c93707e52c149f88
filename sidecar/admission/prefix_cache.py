"""The block hashes of vLLM's prefix cache, as far as admission needs them. Pure.

vLLM's prefix cache keys a full block of prompt tokens by a hash chained over every block before it
(``vllm/v1/core/kv_cache_utils.py``, ``hash_block_tokens``), so two prompts share a block only when all
tokens up to its end are equal. The sidecar keys blocks the same way (with Python's ``hash``: only equality
matters), for the ledger to count a block held by two requests once (:mod:`sidecar.admission.capacity`).
vLLM also keys a block by the request's extra keys (``generate_block_hash_extra_keys``, 0.32.0): its
``cache_salt`` (the first block's, so the whole chain) and its LoRA adapter (``lora_name``, which the
request's ``model`` selects). So the chain starts from the request's *scope*, its model and salt: two
requests share blocks here only when both are equal. Two names of one base model (``--served-model-name a
b``) are kept apart too, which only counts a block twice: safe. Media parts key blocks as well; a prompt
with media has no token ids here (:mod:`sidecar.admission.body`), so none of its blocks is shared.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from sidecar.admission.geometry import PoolView


def prefix_hashes(token_ids: Sequence[int], block_size: int, scope: Hashable = None) -> tuple[int, ...]:
    """Chained hashes of the prompt blocks vLLM's prefix cache can share: ``floor((n - 1) / block_size)``."""
    shareable = max(0, (len(token_ids) - 1) // block_size)
    hashes: list[int] = []
    parent = hash(scope)
    for index in range(shareable):
        parent = hash((parent, tuple(token_ids[index * block_size : (index + 1) * block_size])))
        hashes.append(parent)
    return tuple(hashes)


def prompt_hashes(
    prompt_ids: Iterable[Sequence[int]] | None, pool: PoolView, scope: Hashable = None
) -> tuple[tuple[int, ...], ...]:
    """Each prompt's shareable block hashes in ``scope`` (model and salt): with exact ids and caching on."""
    if prompt_ids is None or not pool.shares_prefixes:
        return ()
    return tuple(prefix_hashes(ids, pool.block_size, scope) for ids in prompt_ids)
