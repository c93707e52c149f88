"""Run with vLLM's python: tiny DeepSeek-V4 configs as vLLM 0.32 caches them on the CPU server.

``make TOKENIZER_DIR OUT``: in ``OUT``, one folder per layout with a ``config.json`` in the published
checkpoint's format (``compress_ratios``, the trailing MTP placeholder included; hidden 256, 4 heads, the
published 512-value latent, 128-value indexer keys and 128-token window) and the tiny model's tokenizer.
Weights are vLLM's own random ones (``load_format="dummy"``): the caches depend on the config alone.

* ``flash``: ratios 0, 4, 128, 4 (a window-only layer, two compressed-sparse layers with indexers, one
  heavily compressed layer);
* ``flash6``: ratios 0, 0, 4, 128, 4, 128: the published DeepSeek-V4-Flash's pattern, cut to six layers.

``measure OUT``: load each (CPU, 1 GiB of KV, ``max_model_len`` 4096, 1,024 tokens a step) and print per run
each KV cache group's block size, page bytes and layer names, the blocks, the maximum concurrency and the
engine's in-flight tokens. Used by ``test_deepseek_v4.py``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import inprocess  # a sibling module: this script's folder is on sys.path

LAYOUTS = {"flash": [0, 4, 128, 4], "flash6": [0, 0, 4, 128, 4, 128]}
CONFIG: dict[str, Any] = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
    "q_lora_rank": 64, "o_lora_rank": 64, "o_groups": 2, "moe_intermediate_size": 64, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "n_shared_experts": 1, "num_hash_layers": 1, "vocab_size": 512,
    "max_position_embeddings": 4096, "index_n_heads": 4, "index_head_dim": 128, "index_topk": 64,
    "num_nextn_predict_layers": 1, "sliding_window": 128, "hc_eps": 1e-6, "hc_mult": 4, "hc_sinkhorn_iters": 20,
    "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000, "compress_rope_theta": 160000,
    "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "swiglu_limit": 10.0, "norm_topk_prob": True,
    "topk_method": "noaux_tc", "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 0,
    "eos_token_id": 1,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 256,
                     "type": "yarn"},
}  # fmt: skip


def make(tokenizer_dir: Path, root: Path) -> None:
    """The configs (see the module docstring), each beside the tiny model's tokenizer."""
    for name, ratios in LAYOUTS.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        config = CONFIG | {"num_hidden_layers": len(ratios), "compress_ratios": [*ratios, 0]}
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_dir / file, folder / file)


def view(worker: Any) -> dict[str, Any]:
    """Each group's block, page and layers beside the pool, and the tokens vLLM counts in flight."""
    runner = worker.model_runner
    groups = [
        {"layers": sorted(g.layer_names), "block_size": g.kv_cache_spec.block_size,
         "page": g.kv_cache_spec.page_size_bytes}
        for g in runner.kv_cache_config.kv_cache_groups
    ]  # fmt: skip
    return inprocess.pool_view(worker) | {
        "groups": groups,
        "in_flight": runner.vllm_config.max_in_flight_tokens,
    }


def measure(root: Path) -> None:
    """Print what the engine holds for each layout."""
    common = {"max_model_len": 4096, "max_num_batched_tokens": 1024, "dtype": "bfloat16", "max_num_seqs": 4,
              "load_format": "dummy"}  # fmt: skip
    inprocess.print_engines(
        "DEEPSEEK_V4", [(name, common | {"model": str(root / name)}) for name in LAYOUTS], view
    )


if __name__ == "__main__":
    inprocess.probe_main(make, measure)
