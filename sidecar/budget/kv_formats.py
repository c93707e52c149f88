"""vLLM's packed KV-cache formats: bytes a token costs per KV head, and the layers and blocks they change.

Pure. Beside the plain element types (:data:`sidecar.budget.dtypes.KV_DTYPES`), vLLM's ``--kv-cache-dtype``
names formats whose cost is not one size per element: a scale or a norm per head and token, keys and values
at different widths. Each is written here once, as the bytes one token takes in one KV head (K and V
together), and read where vLLM computes its page (0.32.0 as installed; 0.20.0-0.34.0 from the release
wheels on PyPI for the version gates):

* ``int8_per_token_head`` / ``fp8_per_token_head``: one byte an element plus a float32 scale for K and one
  for V (``TritonAttentionBackend.customize_spec``, ``v1/attention/backends/triton_attn.py``:
  ``content = (hs_k + hs_v) * dtype_size + 2 * 4``; before 0.28 the same bytes were added in
  ``AttentionSpec.page_size_bytes``), from 0.20.0. ``int4_per_token_head`` packs two elements a byte
  (``hs // 2`` each) with the same scales, from 0.25.0. Only the Triton backend runs them.
* ``turboquant_k8v4``, ``turboquant_4bit_nc``, ``turboquant_k3v4_nc``, ``turboquant_3bit_nc``, from 0.20.0:
  one slot a head (``TurboQuantConfig.slot_size_aligned``,
  ``model_executor/layers/quantization/turboquant/config.py``, the same in 0.20.0 and 0.34.0): keys of
  ``head`` FP8 bytes (k8) or ``ceil(head x bits / 8)`` + a 2-byte norm, values of ``ceil(head x bits / 8)``
  + 4 bytes of scale and zero, rounded up to an even size.
  **Boundary layers**: vLLM keeps the first and last ``min(2, layers // 2)`` layers at the model's dtype
  (``get_boundary_skip_layers``, added to ``kv_cache_dtype_skip_layers`` by ``EngineArgs``), except in
  hybrid models with state layers (none there, from 0.22.0; 0.20.0 refuses hybrids). All full-attention
  layers still share one group (``UniformTypeKVCacheSpecs``: one block id, each layer its own page), so a
  token costs the sum of the layers' pages. **Block**: from 0.25.0 ``_align_heterogeneous_kv_block_size``
  (``platforms/interface.py``) raises ``--block-size`` so the quantised page covers a 16-token page of a
  boundary layer. It measures the quantised page with the first layer's backend, a boundary layer's
  (FlashAttention or FlashInfer, which leave the spec unpacked: ``head`` bytes for K and for V), so the
  block becomes ``a x cdiv(16 x r, a)`` with ``a = max(16, block)`` and ``r`` the model dtype's bytes:
  32 tokens for a 16-bit model at the default 16.

No MLA backend accepts these formats (``supported_kv_cache_dtypes`` of every backend under
``v1/attention/backends/mla/``), so vLLM cannot start an MLA model with them: :func:`check_kv_format`.
Not modelled (a one-line error names them): ``ultraquant_4bit`` (0.32.0, AMD's FlyDSL kernels), the
``octave_*`` formats (0.33.0) and ``fp8_ds_mla`` / ``nvfp4_ds_mla`` (DeepSeek's sparse-MLA records, which
the planner picks itself for DeepSeek-V3.2/V4: :mod:`sidecar.budget.deepseek_v41`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from sidecar.budget.dtypes import (
    FLOAT_DTYPES,
    WEIGHT_DTYPES,
    kv_bytes_per_element,
    normalise_dtype,
    serving_dtype,
)
from sidecar.budget.layer_kinds import LayerKind, vllm_is_hybrid
from sidecar.budget.state_layers import KERNEL_BLOCK  # the boundary page the block is raised to cover
from sidecar.errors import UsageError

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

SCALE_BYTES: Final = 4
"""A float32 scale, one for K and one for V per head and token in the per-token-head formats."""
BOUNDARY_LAYERS: Final = 2
"""Layers TurboQuant keeps at the model's dtype at each end of a dense model (vLLM's boundary skip layers)."""


@dataclass(frozen=True, slots=True)
class KvFormat:
    """One of vLLM's packed ``--kv-cache-dtype`` formats."""

    name: str  # vLLM's spelling
    since: int  # the first 0.x release that has it
    key_bits: int  # 8: one byte an element (FP8 or int8); fewer: packed
    value_bits: int
    per_token_head: bool  # a float32 scale per head and token for K and for V (Triton)
    boundary: bool  # TurboQuant: the first and last layers keep the model's dtype

    def head_bytes(self, head_size: int) -> int:
        """Bytes one token takes in one KV head, K and V together."""
        if self.per_token_head:
            return 2 * (head_size * self.key_bits // 8) + 2 * SCALE_BYTES
        key = head_size if self.key_bits == 8 else math.ceil(head_size * self.key_bits / 8) + 2
        slot = key + math.ceil(head_size * self.value_bits / 8) + 4
        return slot + slot % 2

    @property
    def backend(self) -> str:
        """The attention backend vLLM runs the format on, for notes."""
        return "Triton" if self.per_token_head else "TurboQuant"


KV_FORMATS: Final[dict[str, KvFormat]] = {
    f.name: f
    for f in (
        KvFormat("int8_per_token_head", 20, 8, 8, per_token_head=True, boundary=False),
        KvFormat("fp8_per_token_head", 20, 8, 8, per_token_head=True, boundary=False),
        KvFormat("int4_per_token_head", 25, 4, 4, per_token_head=True, boundary=False),
        KvFormat("turboquant_k8v4", 20, 8, 4, per_token_head=False, boundary=True),
        KvFormat("turboquant_4bit_nc", 20, 4, 4, per_token_head=False, boundary=True),
        KvFormat("turboquant_k3v4_nc", 20, 3, 4, per_token_head=False, boundary=True),
        KvFormat("turboquant_3bit_nc", 20, 3, 3, per_token_head=False, boundary=True),
    )
}
"""vLLM's packed KV formats the planner models, by vLLM's spelling."""

UNMODELLED_KV_FORMATS: Final = (
    "ultraquant_4bit",
    "octave_k3v4",
    "octave_k3v3",
    "octave_k3v3_compact",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
)
"""vLLM spellings (0.32.0-0.34.0) the planner does not model: refused with a line that says so."""
VLLM_KV_FORMATS: Final = frozenset(KV_FORMATS) | frozenset(UNMODELLED_KV_FORMATS)
"""Every packed spelling ``--kv-cache-dtype`` takes (the plain ones: :data:`~.dtypes.KV_DTYPES`)."""

HYBRID_TURBOQUANT_SINCE: Final = 22
"""TurboQuant on models with state layers: 0.20.0 refuses them, 0.22.0 keeps no boundary layers there."""


def kv_format(kv_cache_dtype: str) -> KvFormat | None:
    """The packed format ``kv_cache_dtype`` names, ``None`` for a plain element type."""
    return KV_FORMATS.get(kv_cache_dtype.strip().lower())


def boundary_layer_count(request: PlanRequest) -> int:
    """Attention layers vLLM keeps at the model's dtype under the request's format (0 for most)."""
    fmt, arch = kv_format(request.kv_cache_dtype), request.architecture
    if fmt is None or not fmt.boundary or vllm_is_hybrid(request.architecture.kv_kinds):
        return 0
    n = min(BOUNDARY_LAYERS, arch.num_layers // 2)
    return sum(kind.attends for kind in _ends(arch.kv_kinds, n))


def model_kv_dtype(request: PlanRequest) -> str:
    """The dtype ``--kv-cache-dtype auto`` stores: ``--dtype``'s float when given, else the checkpoint's."""
    served = normalise_dtype(request.weight_dtype) if request.weight_dtype else None
    if served is not None and served in FLOAT_DTYPES:
        return served
    return serving_dtype(request.architecture.dtype)


def native_kv_element(request: PlanRequest) -> float:
    """Bytes a KV element takes at the model's dtype (``--kv-cache-dtype auto``; ``--dtype float32``: 4)."""
    dtype = model_kv_dtype(request)
    return WEIGHT_DTYPES[dtype] if dtype in FLOAT_DTYPES else kv_bytes_per_element(dtype, dtype)


def packed_layer_bytes(request: PlanRequest) -> float | None:
    """Bytes a token costs in one attention layer on one GPU (boundary layers averaged in), or ``None``."""
    fmt, arch = kv_format(request.kv_cache_dtype), request.architecture
    if fmt is None:
        return None
    heads = arch.kv_heads_per_gpu(request.tensor_parallel_size)
    packed = heads * fmt.head_bytes(arch.head_dim)
    attending = sum(kind.attends for kind in arch.kv_kinds) or 1
    boundary = boundary_layer_count(request)
    native = arch.kv_elements_per_token_per_layer(request.tensor_parallel_size) * native_kv_element(request)
    return (boundary * native + (attending - boundary) * packed) / attending


def packed_block_size(request: PlanRequest, block: int) -> int:
    """The block vLLM settles on: raised so the quantised page covers a boundary layer's 16-token page."""
    if not boundary_layer_count(request) or not request.release.at_least(25):
        return block
    ratio = math.ceil(native_kv_element(request))  # to the unpacked uint8 page the first backend measures
    align = max(KERNEL_BLOCK, block)
    return max(block, align * math.ceil(KERNEL_BLOCK * ratio / align))


def check_kv_format(request: PlanRequest) -> None:
    """Raise :class:`UsageError` where vLLM would not start with the request's KV format."""
    name = request.kv_cache_dtype.strip().lower()
    if name in UNMODELLED_KV_FORMATS:
        raise UsageError(
            f"--kv-cache-dtype {name} is vLLM's but not modelled by the planner: plan with fp8 for an "
            "estimate (the sidecar admits by the pool the engine reports)"
        )
    fmt = KV_FORMATS.get(name)
    if fmt is None:
        return
    release, arch = request.release, request.architecture
    if not release.at_least(fmt.since):
        raise UsageError(
            f"vLLM {release} has no --kv-cache-dtype {name} (from 0.{fmt.since}.0): choose fp8, or a "
            "newer release"
        )
    if arch.mla is not None or arch.v4 is not None:
        raise UsageError(
            f"vLLM has no MLA attention backend for --kv-cache-dtype {name}: MLA models such as "
            f"{arch.class_name or arch.model_type} do not start with it; use fp8 or auto"
        )
    if (
        fmt.boundary
        and vllm_is_hybrid(request.architecture.kv_kinds)
        and not release.at_least(HYBRID_TURBOQUANT_SINCE)
    ):
        raise UsageError(
            f"vLLM {release} refuses TurboQuant KV for models with state layers (from "
            f"0.{HYBRID_TURBOQUANT_SINCE}.0); choose fp8, or a newer release"
        )


def kv_format_notes(request: PlanRequest, block: int) -> tuple[str, ...]:
    """What a plan with a packed format should say: the boundary layers and the raised block."""
    fmt = kv_format(request.kv_cache_dtype)
    if fmt is None:
        return ()
    arch = request.architecture
    size = fmt.head_bytes(arch.head_dim)
    plain = 2 * arch.head_dim * native_kv_element(request)
    notes = [
        f"{fmt.name} on vLLM's {fmt.backend} backend: {size} bytes a token and KV head against "
        f"{plain:.0f} at the model's dtype"
    ]
    boundary = boundary_layer_count(request)
    if boundary:
        ends = min(BOUNDARY_LAYERS, arch.num_layers // 2)
        raised = (
            f"; it raises the block to {block} tokens so a quantised page covers a 16-token one of theirs"
            if block > request.block_size
            else ""
        )
        notes.append(
            f"vLLM keeps {boundary} boundary layers (the first and last {ends}) at the model's dtype{raised}"
        )
    if LayerKind.SLIDING in arch.kv_kinds and fmt.boundary:
        notes.append(
            "sliding-window layers under TurboQuant: vLLM pads a boundary window layer's page to the shared "
            "one and picks its block within it, which the plan does not model (each layer at its own page)"
        )
    return tuple(notes)


def _ends(kinds: tuple[LayerKind, ...], n: int) -> tuple[LayerKind, ...]:
    """The first and last ``n`` layers' kinds, each layer once."""
    indices = sorted(set(range(n)) | set(range(len(kinds) - n, len(kinds))))
    return tuple(kinds[i] for i in indices if 0 <= i < len(kinds))
