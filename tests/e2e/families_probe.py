"""Run with vLLM's python: tiny models of the families the defaults sweep found misread, as vLLM 0.32 loads them.

``make TOKENIZER_DIR OUT``: in ``OUT``, random-weight models as transformers 5.19 writes them (hidden 128, two
layers or four, vocabulary 512), one per family whose layer the plan used to read as Llama's:

* ``ernie-moe``: ERNIE 4.5's experts (``moe_num_experts`` 4, ``moe_k`` 2, one shared expert), the first
  layer dense (``moe_layer_start_index`` 1);
* ``starcoder2``: a two-matrix MLP with biases everywhere (``use_bias``) and LayerNorms with a bias;
* ``arcee``: a two-matrix ReLU^2 MLP;
* ``exaone-moe``: ``num_shared_experts``, QK norms, the first layer dense.

``measure OUT``: load each in vLLM in-process (CPU, 1 GiB of KV, ``max_model_len`` 512) and print per run the
names of the parameters vLLM built (the CPU backend repacks linear weights, so their sizes read 0 there: the
names are the evidence), the block size, the blocks and the maximum concurrency. Used by
``test_families.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import inprocess  # a sibling module: this script's folder is on sys.path
import transformers as tf

BASE: dict[str, Any] = {
    "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 1024, "tie_word_embeddings": False,
    "num_hidden_layers": 4,
}  # fmt: skip
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {  # name: (config class, model class, arguments)
    "ernie-moe": (
        "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM",
        {"moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 64, "moe_num_shared_experts": 1,
         "moe_layer_start_index": 1, "moe_layer_end_index": 3, "moe_layer_interval": 1},
    ),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {"use_bias": True, "sliding_window": None}),
    "arcee": ("ArceeConfig", "ArceeForCausalLM", {"hidden_act": "relu2"}),
    "exaone-moe": (
        "ExaoneMoeConfig", "ExaoneMoeForCausalLM",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "num_shared_experts": 1,
         "first_k_dense_replace": 1, "layer_types": ["full_attention"] * 4},
    ),
}  # fmt: skip


def make(tokenizer_dir: Path, root: Path) -> None:
    """The models (see the module docstring)."""
    for name, (config_class, model_class, extra) in MODELS.items():
        config = getattr(tf, config_class)(**(BASE | extra))
        inprocess.save_model(getattr(tf, model_class)(config), root / name, tokenizer_dir)


def view(worker: Any) -> dict[str, Any]:
    """The names of the parameters vLLM built, beside the pool."""
    names = [name for name, _ in worker.model_runner.model.named_parameters()]
    return inprocess.pool_view(worker) | {"parameters": names}


def measure(root: Path) -> None:
    """Print what the engine holds for each model."""
    common = {"max_model_len": 512, "dtype": "bfloat16", "max_num_seqs": 4}
    inprocess.print_engines(
        "FAMILIES", [(name, common | {"model": str(root / name)}) for name in MODELS], view
    )


if __name__ == "__main__":
    inprocess.probe_main(make, measure)
