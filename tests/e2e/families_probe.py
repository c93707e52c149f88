"""Run with vLLM's python: tiny models of the families the defaults sweep found misread, as vLLM 0.32 loads them.

``make TOKENIZER_DIR OUT``: in ``OUT``, random-weight models as transformers 5.19 writes them (hidden 128, two
layers or four, vocabulary 512), one per family whose layer the plan used to read as Llama's:

* ``ernie-moe``: ERNIE 4.5's experts (``moe_num_experts`` 4, ``moe_k`` 2, one shared expert), the first
  layer dense (``moe_layer_start_index`` 1);
* ``starcoder2``: a two-matrix MLP with biases everywhere (``use_bias``) and LayerNorms with a bias;
* ``arcee``: a two-matrix ReLU^2 MLP;
* ``exaone-moe``: ``num_shared_experts``, QK norms, the first layer dense;
* ``mimo``: MiMo-V2-Flash's layout as its published config gives it (``hybrid_layer_pattern`` [0, 1, 1, 0],
  ``sliding_window_size`` 64, ``moe_layer_freq``, sinks in the sliding layers), the sliding layers with four KV
  heads of their own (``swa_num_key_value_heads``) where the full ones have two. transformers 5.19's
  ``MiMoV2FlashForCausalLM`` builds every layer alike, so the sliding layers' key and value projections are
  rewritten at their own shape after saving. Keys and values keep one size: vLLM's CPU server has no
  attention backend for values narrower than keys (``*_DIFFKV`` need a GPU).
* ``step``: Step 3.5's layout as Step-3.5-Flash's config gives it (vLLM's own ``Step3p5Config``; transformers
  5.19 has no causal-LM class for it, so vLLM builds it with dummy weights from ``config.json`` alone):
  ``attention_other_setting`` gives the sliding layers 8 query heads and 4 KV heads where the full ones have
  4 and 2, ``num_attention_groups``, ``moe_layers_enum`` "2,3", ``share_expert_dim``, the per-head gate, and
  ``layer_types`` padded with an MTP layer's entry.

``measure OUT``: load each in vLLM in-process (CPU, 1 GiB of KV, ``max_model_len`` 512) and print per run the
names of the parameters vLLM built (the CPU backend repacks linear weights, so their sizes read 0 there: the
names are the evidence), the KV groups (layers, block size), the blocks and the maximum concurrency. Used by
``test_families.py``.
"""

from __future__ import annotations

import json
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


MIMO_PATTERN = [0, 1, 1, 0]
MIMO_SLIDING_KV_HEADS = 4
MIMO_PUBLISHED: dict[str, Any] = {  # what the published config.json adds to transformers' fields
    "hybrid_layer_pattern": MIMO_PATTERN, "sliding_window_size": 64, "moe_layer_freq": [0, 1, 1, 1],
    "swa_num_attention_heads": 4, "swa_num_key_value_heads": MIMO_SLIDING_KV_HEADS, "swa_head_dim": 32,
    "swa_v_head_dim": 32, "add_swa_attention_sink_bias": True, "layernorm_epsilon": 1e-5,
}  # fmt: skip
MODELS["mimo"] = (
    "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM",
    {"v_head_dim": 32, "moe_intermediate_size": 64, "n_routed_experts": 4, "num_experts_per_tok": 2,
     "sliding_window": 64, "layer_types": ["sliding_attention" if p else "full_attention" for p in MIMO_PATTERN],
     "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"]},
)  # fmt: skip


def _mimo_as_published(folder: Path) -> None:
    """The published config's fields, and the sliding layers' K and V projections at their own KV heads."""
    import torch  # noqa: PLC0415 - vLLM's python has them
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    config = json.loads((folder / "config.json").read_text()) | MIMO_PUBLISHED
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    tensors = load_file(folder / "model.safetensors")
    rows = MIMO_SLIDING_KV_HEADS * BASE["head_dim"]
    for index in (i for i, slides in enumerate(MIMO_PATTERN) if slides):
        for projection in ("k_proj", "v_proj"):
            name = f"model.layers.{index}.self_attn.{projection}.weight"
            tensors[name] = (torch.randn(rows, BASE["hidden_size"]) * 0.02).to(torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


STEP: dict[str, Any] = {  # Step-3.5-Flash's fields at the tiny model's sizes
    "architectures": ["Step3p5ForCausalLM"], "model_type": "step3p5", "hidden_size": 128, "num_hidden_layers": 4,
    "vocab_size": 512, "head_dim": 32, "num_attention_heads": 4, "num_attention_groups": 2,
    "intermediate_size": 256, "moe_num_experts": 4, "moe_top_k": 2, "moe_intermediate_size": 64,
    "share_expert_dim": 96, "moe_layers_enum": "2,3", "sliding_window": 64, "use_head_wise_attn_gate": True,
    "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 8,
                                "num_attention_groups": 4, "head_dim": 32},
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention",
                    "sliding_attention"],
    "num_nextn_predict_layers": 1, "rope_theta": [10000.0] * 5, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}  # fmt: skip
DUMMY = ("step",)  # built by vLLM from config.json with random weights (load_format "dummy")


def make(tokenizer_dir: Path, root: Path) -> None:
    """The models (see the module docstring)."""
    for name, (config_class, model_class, extra) in MODELS.items():
        config = getattr(tf, config_class)(**(BASE | extra))
        inprocess.save_model(getattr(tf, model_class)(config), root / name, tokenizer_dir)
    _mimo_as_published(root / "mimo")
    (root / "step").mkdir(parents=True, exist_ok=True)
    (root / "step" / "config.json").write_text(json.dumps(STEP, indent=1))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (root / "step" / file).write_bytes((tokenizer_dir / file).read_bytes())


def view(worker: Any) -> dict[str, Any]:
    """The names of the parameters vLLM built, beside the pool."""
    runner = worker.model_runner
    names = [name for name, _ in runner.model.named_parameters()]
    groups = [
        {"layers": sorted(g.layer_names), "block_size": g.kv_cache_spec.block_size}
        for g in runner.kv_cache_config.kv_cache_groups
    ]
    return inprocess.pool_view(worker) | {"parameters": names, "groups": groups}


def measure(root: Path) -> None:
    """Print what the engine holds for each model."""
    common = {"max_model_len": 512, "dtype": "bfloat16", "max_num_seqs": 4}
    runs = [(name, common | {"model": str(root / name)}) for name in MODELS]
    runs += [(name, common | {"model": str(root / name), "load_format": "dummy"}) for name in DUMMY]
    inprocess.print_engines("FAMILIES", runs, view)


if __name__ == "__main__":
    inprocess.probe_main(make, measure)
