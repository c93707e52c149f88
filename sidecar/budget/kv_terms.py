"""The KV pool's per-layer terms for the ledger: bytes a token costs, blocks a request holds, state pages.

Pure. :mod:`sidecar.budget.ledger` composes these into vLLM's pool. A layer holds a sequence's tokens in
full, within a window or chunk (:mod:`sidecar.budget.kv_groups` for the caps), or as a fixed-size state
(:mod:`sidecar.budget.state_layers`: its page sets the block size, and a request holds a few pages per state
group whatever its length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.budget.architecture import Architecture
from sidecar.budget.dtypes import kv_bytes_per_element, normalise_dtype
from sidecar.budget.kv_formats import native_kv_element, packed_layer_bytes
from sidecar.budget.kv_groups import KvGroups, chunked_local_blocks, sliding_window_blocks
from sidecar.budget.layer_kinds import LayerKind
from sidecar.budget.speculative import drafter_kv_layers
from sidecar.budget.state_layers import KERNEL_BLOCK, StateRules, hybrid_block_size

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest


def layer_kv_bytes_per_token(request: PlanRequest) -> float:
    """Bytes one token costs in one attention layer on one GPU (with a DSA indexer's cache, on average)."""
    arch = request.architecture
    packed = packed_layer_bytes(request)  # vLLM's packed formats (sidecar.budget.kv_formats)
    if packed is not None:
        return packed
    if normalise_dtype(request.kv_cache_dtype) == "auto":
        element = native_kv_element(request)  # --dtype float32: the KV cache is float32 too
    else:
        element = kv_bytes_per_element(request.kv_cache_dtype, arch.dtype)
    indexer = arch.indexer  # its own cache in the same group: spread over the layers, the total is exact
    indexed = indexer.cache_bytes_per_token * len(indexer.layers) / arch.num_layers if indexer else 0.0
    return arch.kv_elements_per_token_per_layer(request.tensor_parallel_size) * element + indexed


@dataclass(frozen=True, slots=True)
class KvPages:
    """Bytes a token costs per layer kind, and the block each kind's groups use once vLLM unifies pages.

    Every layer caches at the model's geometry except Gemma 4's full-attention layers (their own head size
    and KV heads: :mod:`sidecar.budget.gemma4`). A block holds one page per layer of a group, and pages must
    be one size: ``unify_kv_cache_spec_page_size`` (``vllm/v1/core/kv_cache_utils.py``, 0.24.0 to 0.32.0)
    gives a layer whose page is smaller than the largest ``ratio x`` its block when the ratio is whole, and
    pads its page otherwise. A sliding-window layer starts from ``block_size`` tokens, except in 0.25.0 to
    0.29.x, where it starts from the attention kernel's smallest block, 16 on GPUs
    (``Attention.get_kv_cache_spec``: ``_largest_kernel_block_within`` with no page budget; from 0.30.0 the
    budget is ``block_size`` tokens' page). Equal geometries end at ``block_size`` either way; Gemma 4's
    do not (the real CPU server, 0.32: a sliding page half the full one gives 256-token sliding blocks
    beside 128-token full ones, ``tests/e2e/test_gemma4.py``; the 0.29 L40S boots of Gemma 4 26B-A4B at
    ``--block-size`` 48 and 16, ``kv-arithmetic.json``).
    """

    per_kind: dict[LayerKind, float]  # bytes one token costs in one layer of each attending kind
    blocks: dict[LayerKind, int]  # tokens a block of each attending kind's groups holds
    page_bytes: float  # the largest page: what one layer's share of a block is sized by

    def per_token(self, kinds: tuple[LayerKind, ...]) -> float:
        """Bytes one token costs over ``kinds`` (state and KV-less layers: none)."""
        return sum(self.per_kind[kind] for kind in kinds if kind.attends)


def kv_pages(request: PlanRequest, kinds: tuple[LayerKind, ...], per_layer: float, block: int) -> KvPages:
    """:class:`KvPages` for ``kinds`` at ``block`` tokens a block (raised for state layers).

    ``per_layer``: :func:`layer_kv_bytes_per_token`.
    """
    arch, tp = request.architecture, request.tensor_parallel_size
    base, full = arch.kv_elements_per_token_per_layer(tp), arch.full_kv_elements_per_token_per_layer(tp)
    elements = {LayerKind.FULL: full, LayerKind.SLIDING: base, LayerKind.CHUNKED: base}
    start = dict.fromkeys(elements, block)
    if request.release.sliding_block_starts_at_kernel_minimum():
        start[LayerKind.SLIDING] = KERNEL_BLOCK
    pages = {kind: start[kind] * elements[kind] for kind in elements}
    present = {kind for kind in kinds if kind.attends} or {LayerKind.FULL}
    largest = max(pages[kind] for kind in present)
    return KvPages(
        per_kind={kind: per_layer * count / base for kind, count in elements.items()},
        blocks={
            kind: start[kind] * (largest // page if largest % page == 0 else 1)
            for kind, page in pages.items()
        },
        page_bytes=per_layer * largest / base,
    )


def kv_layer_kinds(request: PlanRequest) -> tuple[LayerKind, ...]:
    """The layer kinds the release sizes: chunked layers count as full ones where it does not group them."""
    arch, drafter = request.architecture, (LayerKind.FULL,) * drafter_kv_layers(request)  # MTP layers attend
    if arch.attention_chunk_size and request.release.groups_chunked_local_attention():
        return arch.kv_kinds + drafter
    return tuple(LayerKind.FULL if kind is LayerKind.CHUNKED else kind for kind in arch.kv_kinds) + drafter


def tokens_held(kind: LayerKind, arch: Architecture, length: int) -> int:
    """Tokens of a ``length``-token sequence one layer of ``kind`` keeps (a state layer: none)."""
    if not kind.attends:
        return 0
    if kind is LayerKind.SLIDING and arch.sliding_window:
        return min(arch.sliding_window, length)
    if kind is LayerKind.CHUNKED and arch.attention_chunk_size:
        return min(arch.attention_chunk_size, length)
    return length


@dataclass(frozen=True, slots=True)
class StateTerms:
    """A hybrid model's state layers as vLLM sizes them (:mod:`sidecar.budget.state_layers`)."""

    page_bytes: int  # one layer's state on one GPU, before padding to the attention page
    block_size: int  # the block size vLLM settles on
    blocks_per_group: int  # blocks one full-length request holds in each state group
    layers: int  # state layers


def state_terms(request: PlanRequest, per_layer: float) -> StateTerms | None:
    """The state layers' page, the block size they impose and their blocks per request, if any."""
    arch = request.architecture
    if arch.state is None or LayerKind.STATE not in arch.kv_kinds:
        return None
    speculative = request.speculative.num_speculative_tokens if request.speculative else 0
    rules = StateRules(request.release.minor)
    page = arch.state.page_bytes(
        request.tensor_parallel_size,
        arch.dtype,
        request.mamba_ssm_cache_dtype,
        rules.conv_draft_slots(arch.state, speculative),
        request.mamba_cache_dtype,
    )
    caching = request.enable_prefix_caching
    mode = rules.mode(
        arch.state, prefix_caching=rules.prefix_caching_default() if caching is None else caching
    )
    chunk = arch.state.chunk_size if mode == "all" else 0
    block = hybrid_block_size(request.block_size, page, math.ceil(per_layer), chunk)
    blocks = rules.blocks_per_request(
        arch.state,
        mode=mode,
        speculative_tokens=speculative,
        sequence_blocks=math.ceil(request.effective_max_model_len / block),
    )
    return StateTerms(page, block, blocks, sum(kind is LayerKind.STATE for kind in arch.kv_kinds))


def blocks_per_request(
    request: PlanRequest, kind: LayerKind, length: int, block: int, state: StateTerms | None
) -> int:
    """Blocks one ``length``-token request holds in one group of ``kind`` (``block``: that group's)."""
    full_blocks = math.ceil(length / block)
    window, chunk = request.architecture.sliding_window, request.architecture.attention_chunk_size
    if kind is LayerKind.STATE:
        return state.blocks_per_group if state else 0
    if kind is LayerKind.NONE:
        return 0
    if kind is LayerKind.SLIDING and window:  # one more than the sequence's own when the window spans it
        return sliding_window_blocks(window, request.in_flight_tokens, length, block)
    if kind is LayerKind.CHUNKED and chunk:
        return min(full_blocks, chunked_local_blocks(chunk, request.in_flight_tokens, length, block))
    return full_blocks


def sequence_kv_bytes(
    request: PlanRequest,
    kinds: tuple[LayerKind, ...],
    pages: KvPages,
    extra: float,
    state: StateTerms | None,
) -> float:
    """Bytes one full-length sequence holds on one GPU: its tokens in each layer, a state layer's pages."""
    length, arch = request.effective_max_model_len, request.architecture
    held = sum(pages.per_kind[kind] * tokens_held(kind, arch, length) for kind in kinds if kind.attends)
    held += extra * length
    if state:  # each state layer holds its pages, padded to an attention page
        held += state.layers * state.blocks_per_group * pages.page_bytes
    return held


def full_request_blocks(
    request: PlanRequest, groups: KvGroups, state: StateTerms | None, pages: KvPages
) -> int:
    """Blocks one full-length request holds over every group (``get_max_concurrency_for_kv_cache_config``)."""
    length, block = request.effective_max_model_len, state.block_size if state else request.block_size
    return sum(
        count * blocks_per_request(request, kind, length, pages.blocks.get(kind, block), state)
        for kind, count in (
            (LayerKind.FULL, groups.full),
            (LayerKind.SLIDING, groups.sliding),
            (LayerKind.CHUNKED, groups.chunked),
            (LayerKind.STATE, groups.state),
        )
    )


def reported_pool_tokens(
    request: PlanRequest, groups: KvGroups, state: StateTerms | None, pool: tuple[float, int, int], block: int
) -> int:
    """The "KV cache size: N tokens" vLLM logs, from (exact concurrency, num_gpu_blocks, all-layer blocks).

    ``block``: the block vLLM settled on (raised for state layers and for TurboQuant's boundary layers).
    """
    exact_concurrency, pool_blocks, num_blocks = pool
    grouped = groups.sliding + groups.chunked + groups.state > 0
    if request.release.pool_tokens_are_concurrency_times_length(windowed=grouped):
        return int(exact_concurrency * request.effective_max_model_len)
    if state:  # before 0.22: the blocks shared out over the groups
        return pool_blocks // (groups.full + groups.state) * state.block_size
    return num_blocks * block


def state_note(request: PlanRequest, state: StateTerms | None, state_groups: int) -> tuple[str, ...]:
    """What the state layers take, for ``plan``'s notes (none without state layers)."""
    arch = request.architecture
    if state is None or arch.state is None:
        return _unmodelled_state_note(arch)
    raised = f"the block is raised to {state.block_size} tokens so an attention page holds one state; "
    return (
        f"{state.layers} {arch.state.mixer.replace('_', ' ')} state layers of {state.page_bytes / 2**20:.2f} "
        f"MiB each per sequence: {raised if state.block_size > request.block_size else ''}a request holds "
        f"{state.blocks_per_group} block(s) in each of {state_groups} state group(s) whatever its length",
    )


def plan_gaps(arch: Architecture) -> str | None:
    """What of the model the plan leaves out, in words (``None`` when nothing), for the drift diagnosis."""
    gaps = (["recurrent-state layers"] if arch.unmodelled_state else []) + list(arch.unmodelled_features)
    return (
        f"the plan does not model {arch.class_name or arch.model_type}'s {', '.join(gaps)}" if gaps else None
    )


def _unmodelled_state_note(arch: Architecture) -> tuple[str, ...]:
    """A note for a model that keeps a state per sequence in layers the plan does not model (or none)."""
    if not arch.unmodelled_state:
        return ()
    return (
        f"{arch.class_name or arch.model_type} keeps a recurrent state per sequence beside its attention "
        "layers, which the plan does not model for this family: vLLM's pool holds fewer tokens and "
        "sequences than planned (the sidecar admits by the pool the engine reports)",
    )
