"""Run with vLLM's python: tiny Gemma 4 text models, and the KV pool vLLM 0.32 gives each.

``make TOKENIZER_DIR OUT``: in ``OUT``, random-weight ``Gemma4ForCausalLM`` models as transformers 5.19 writes
them (hidden 128, two attention heads, sliding layers of two KV heads of 32 with a 64-token window; the
default 5:1 pattern, the last layer full):

* ``plain``: full-attention heads of 64 (``global_head_dim``), so a full layer's page is twice a sliding
  one's and vLLM gives the sliding layers 256-token blocks;
* ``keys-are-values``: ``attention_k_eq_v`` with one global KV head of 64: equal pages;
* ``small-full``: one global KV head of 32: the full layer's page is half, so it gets the 256-token blocks;
* ``shared``: eight layers, the last two reading earlier layers' KV (``num_kv_shared_layers``), with
  per-layer input embeddings of 16;
* ``moe``: the MoE block beside each dense MLP (four experts of 64, two per token), ``attention_k_eq_v``.

``measure OUT``: load each in vLLM in-process (CPU, 1 GiB of KV, ``max_model_len`` 512) and print per run the
block size, the groups (layer names and each group's block size), the blocks and the maximum concurrency.
Used by ``test_gemma4.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import inprocess  # a sibling module: this script's folder is on sys.path
import transformers as tf

BASE: dict[str, Any] = {
    "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32,
    "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 1024, "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6, "num_hidden_layers": 6, "sliding_window": 64, "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": 512,
}  # fmt: skip
MODELS: dict[str, dict[str, Any]] = {
    "plain": {"global_head_dim": 64},
    "keys-are-values": {"global_head_dim": 64, "attention_k_eq_v": True, "num_global_key_value_heads": 1},
    "small-full": {"global_head_dim": 32, "attention_k_eq_v": True, "num_global_key_value_heads": 1},
    "shared": {
        "num_hidden_layers": 8, "global_head_dim": 64, "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 16,
    },
    "moe": {
        "global_head_dim": 64, "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
        "moe_intermediate_size": 64, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
    },
}  # fmt: skip


def make(tokenizer_dir: Path, root: Path) -> None:
    """The models (see the module docstring), with the published spelling of the global geometry kept.

    transformers saves ``per_layer_config`` in place of ``global_head_dim`` and
    ``num_global_key_value_heads``; a published Gemma 4 ``config.json`` carries the latter, so each folder
    also gets ``published.json``: the keyword arguments the model was built from.
    """
    for name, extra in MODELS.items():
        arguments = BASE | extra
        model = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**arguments))
        inprocess.save_model(model, root / name, tokenizer_dir)
        published = arguments | {"model_type": "gemma4_text", "architectures": ["Gemma4ForCausalLM"]}
        (root / name / "published.json").write_text(json.dumps(published))


def view(worker: Any) -> dict[str, Any]:
    """The KV cache's block size, groups (layer names, block size) and blocks, and the maximum concurrency."""
    groups = worker.model_runner.kv_cache_config.kv_cache_groups
    return inprocess.pool_view(worker) | {
        "groups": [
            {"layers": sorted(g.layer_names), "block_size": g.kv_cache_spec.block_size} for g in groups
        ]
    }


def measure(root: Path) -> None:
    """Print what the engine holds for each model."""
    common = {"max_model_len": 512, "dtype": "bfloat16", "max_num_seqs": 4}
    inprocess.print_engines("GEMMA4", [(name, common | {"model": str(root / name)}) for name in MODELS], view)


if __name__ == "__main__":
    inprocess.probe_main(make, measure)
