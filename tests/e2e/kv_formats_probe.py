"""Run with vLLM's python: vLLM 0.32's own pages, boundary layers, block and groups for its packed KV formats.

The CPU server cannot run the Triton or TurboQuant backends (no Triton CPU backend), so this probe calls the
code a GPU engine runs at start-up: ``TritonAttentionBackend.customize_spec`` and
``TurboQuantAttentionBackend.customize_spec`` for a layer's page, ``TurboQuantConfig.get_boundary_skip_layers``
for the layers kept at the model's dtype, ``Platform._align_heterogeneous_kv_block_size`` with the first layer's
backend (a boundary layer's: FlashAttention) for the block, and ``get_kv_cache_groups`` on the specs every layer
registers (``Attention.get_kv_cache_spec``: a ``FullAttentionSpec`` at the block, packed by the backend).

``python kv_formats_probe.py CASES`` (``CASES``: JSON list of ``{"format", "layers", "kv_heads", "head",
"block"}``) prints one ``KV_FORMAT {json}`` line per case: the block, each group's layers and the bytes a block id costs
over them, and the boundary layers.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any


def run(case: dict[str, Any]) -> dict[str, Any]:
    """vLLM's layout for one case (a 16-bit model of ``layers`` full-attention layers)."""
    import torch  # noqa: PLC0415 - vLLM's python has it
    from vllm.config.cache import CacheConfig  # noqa: PLC0415
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig  # noqa: PLC0415
    from vllm.platforms.interface import Platform  # noqa: PLC0415
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE  # noqa: PLC0415
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: PLC0415
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend  # noqa: PLC0415
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend  # noqa: PLC0415
    from vllm.v1.core import kv_cache_utils  # noqa: PLC0415
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode  # noqa: PLC0415

    name, layers, heads, head = case["format"], case["layers"], case["kv_heads"], case["head"]
    turboquant = name.startswith("turboquant_")
    backend = TurboQuantAttentionBackend if turboquant else TritonAttentionBackend
    cache = CacheConfig(block_size=case["block"], cache_dtype=name)
    model = SimpleNamespace(
        is_hybrid=False, hf_text_config=SimpleNamespace(num_hidden_layers=layers), dtype=torch.bfloat16,
        get_num_kv_heads=lambda _parallel: heads, get_head_size=lambda: head, use_mla=False,
    )  # fmt: skip
    if turboquant:  # EngineArgs.create_engine_config adds the boundary layers
        cache.kv_cache_dtype_skip_layers = TurboQuantConfig.get_boundary_skip_layers(model)
    if cache.kv_cache_dtype_skip_layers:  # layer 0 is one: its backend is the first
        Platform._align_heterogeneous_kv_block_size(  # noqa: SLF001
            SimpleNamespace(cache_config=cache, model_config=model, parallel_config=None),
            FlashAttentionBackend,
        )
    block, specs = cache.block_size, {}
    for index in range(layers):
        if str(index) in cache.kv_cache_dtype_skip_layers:
            specs[f"layers.{index}"] = FullAttentionSpec(
                block_size=block, num_kv_heads=heads, head_size=head, dtype=torch.bfloat16
            )
        else:
            specs[f"layers.{index}"] = backend.customize_spec(
                FullAttentionSpec(
                    block_size=block,
                    num_kv_heads=heads,
                    head_size=head,
                    dtype=STR_DTYPE_TO_TORCH_DTYPE[name],
                    kv_quant_mode=get_kv_quant_mode(name),
                )
            )
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False), cache_config=cache,
        model_config=SimpleNamespace(max_model_len=4096), speculative_config=None,
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1),
    )  # fmt: skip
    groups = kv_cache_utils.get_kv_cache_groups(config, specs)
    return {
        **case,
        "block_out": block,
        "boundary": sorted(int(i) for i in cache.kv_cache_dtype_skip_layers),
        "groups": [
            {
                "layers": len(g.layer_names),
                "block": g.kv_cache_spec.block_size,
                "block_bytes": _block_bytes(g),
            }
            for g in groups
        ],
    }


def _block_bytes(group: Any) -> int:
    """Bytes one block id costs over the group's layers: a merged group's page sums them, a uniform one is one's."""
    from vllm.v1.kv_cache_interface import UniformTypeKVCacheSpecs  # noqa: PLC0415

    spec = group.kv_cache_spec
    return int(
        spec.page_size_bytes * (1 if isinstance(spec, UniformTypeKVCacheSpecs) else len(group.layer_names))
    )


if __name__ == "__main__":
    for case in json.loads(sys.argv[1]):
        print("KV_FORMAT " + json.dumps(run(case)), flush=True)
