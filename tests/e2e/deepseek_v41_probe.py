"""Run with vLLM's python: vLLM 0.32's own packing of DeepSeek-V4.1's cache specs.

vLLM's CPU server cannot build DeepSeek-V4.1 (its attention asserts a CUDA device), so this probe builds the
specs each layer's ``get_kv_cache_spec`` returns, with the arguments vLLM 0.32.0's source passes
(``vllm/models/deepseek_v41/attention.py``: ``DeepseekV4Attention.get_kv_cache_spec``,
``DeepseekV4IndexerCache.get_kv_cache_spec``, ``DeepseekV4SWACache(block_size=32)``; ``compressor.py``:
``CompressorStateCache``), and runs vLLM's ``_get_packed_kv_cache_groups``, ``_get_kv_cache_bytes_per_block``
and ``get_max_concurrency_for_kv_cache_config`` on them.

``python deepseek_v41_probe.py CONFIG RECORD`` (``RECORD``: JSON with ``block``, ``window_bytes``,
``latent_bytes``, ``alignment``, ``drafts``, ``max_model_len``, ``in_flight``) prints one ``DEEPSEEK_V41
{json}`` line: each group's spec type, block size, layers and page bytes, the bytes a block id costs and the
blocks a full-length request holds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def specs(text: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """Every layer's cache specs, as vLLM 0.32.0's V4.1 layers register them."""
    import torch  # noqa: PLC0415 - vLLM's python has it
    from vllm.v1.kv_cache_interface import (  # noqa: PLC0415
        CircularBufferSpec,
        MLAAttentionSpec,
        SlidingWindowMLASpec,
    )

    layers = text["num_hidden_layers"]
    ratios = (text["compress_ratios"] + [0] * layers)[:layers]
    sources, index_sources = set(text["kv_source_layer_ids"]), set(text["index_source_layer_ids"])
    packed = {"alignment": record["alignment"], "model_version": "deepseek_v4"}
    rows = max(8, 1 << (record["drafts"] + 1).bit_length())  # CompressorStateCache.block_size
    out: dict[str, Any] = {}
    for i, ratio in enumerate(ratios):
        prefix = f"model.layers.{i}.attn"
        if i in sources:
            out[prefix] = MLAAttentionSpec(
                block_size=record["block"], num_kv_heads=1, head_size=512, dtype=torch.uint8,
                tokens_per_state=ratio, cache_dtype_str="fp8_ds_mla", state_content_bytes=record["latent_bytes"],
                **packed,
            )  # fmt: skip
            if i in index_sources:
                out[f"{prefix}.indexer.k_cache"] = MLAAttentionSpec(
                    block_size=record["block"], num_kv_heads=1, head_size=132, dtype=torch.uint8,
                    tokens_per_state=ratio, alignment=record["alignment"],
                )  # fmt: skip
            if ratio > 1:
                out[f"{prefix}.compressor.state_cache"] = CircularBufferSpec(
                    block_size=rows, num_kv_heads=1, head_size=1024, head_size_v=0, dtype=torch.float32
                )
        out[f"{prefix}.swa_cache"] = SlidingWindowMLASpec(
            block_size=32, num_kv_heads=1, max_tp_shards=1, head_size=512, dtype=torch.uint8,
            sliding_window=text["sliding_window"], cache_dtype_str="fp8_ds_mla",
            state_content_bytes=record["window_bytes"], **packed,
        )  # fmt: skip
    return out


def main(config: Path, record: dict[str, Any]) -> None:
    """Pack the specs with vLLM's code and print what it gives."""
    from vllm.config.cache import CacheConfig  # noqa: PLC0415
    from vllm.v1.core import kv_cache_utils  # noqa: PLC0415
    from vllm.v1.kv_cache_interface import KVCacheConfig  # noqa: PLC0415

    text = json.loads(config.read_text())["text_config"]
    cache = CacheConfig(block_size=record["block"])
    cache.kv_cache_layout = "BLHNC"  # block-outermost, as the engine core resolves it for these backends
    vllm_config = SimpleNamespace(
        cache_config=cache, speculative_config=None, max_in_flight_tokens=record["in_flight"],
        model_config=SimpleNamespace(max_model_len=record["max_model_len"], hf_config=SimpleNamespace(
            model_type="deepseek_v41")),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1),
    )  # fmt: skip
    groups = kv_cache_utils._get_packed_kv_cache_groups(vllm_config, specs(text, record))  # noqa: SLF001
    stride = kv_cache_utils._get_kv_cache_bytes_per_block(groups, cache.get_resolved_kv_cache_layout())  # noqa: SLF001
    blocks = 1_000_000
    concurrency = kv_cache_utils.get_max_concurrency_for_kv_cache_config(
        vllm_config, KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    )
    view = {
        "groups": [
            {"type": type(g.kv_cache_spec.first_spec).__name__, "block": g.kv_cache_spec.block_size,
             "layers": len(g.layer_names), "page": g.kv_cache_spec.page_size_bytes}
            for g in groups
        ],
        "stride": stride,
        "request_blocks": round(blocks / concurrency),
    }  # fmt: skip
    print("DEEPSEEK_V41 " + json.dumps(view), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))
