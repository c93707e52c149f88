"""Run with vLLM's python: tiny hybrid models with recurrent-state layers, and the KV pool vLLM gives each.

``make TOKENIZER_DIR OUT``: in ``OUT``, random-weight models as transformers writes them (hidden 128, attention
layers of two heads and one KV head of 64, so an attention page of 128 tokens is 32 KiB):

* ``qwen3next``: a Qwen3-Next of four layers (``full_attention_interval`` 4: three gated DeltaNet layers,
  one attention layer; two key heads and four value heads of 32; a four-expert MoE);
* ``qwen3next-wide``: the same with eight value heads and key and value heads of 64, whose state (68.5 KiB
  with a 16-bit SSM state) is larger than an attention page, so vLLM raises the block size;
* ``nemotronh``: a Nemotron-H of four layers (Mamba2, attention, Mamba2, MLP; four SSM heads of 32, state 16);
* ``granite``: a Granite-4.0-H (``GraniteMoeHybrid``) of four layers (``layer_types``: Mamba2, attention and two
  Mamba2, the same SSM shape), each with four experts and a shared MLP;
* ``falconh1``: a Falcon-H1 of two layers, each with attention and a Mamba2 mixer side by side (four SSM heads
  of 32, state 16, ``mamba_d_ssm`` 128, the gated norm and projection biases on);
* ``zamba2``: a Zamba2 of six layers, each with a Mamba2 mixer (eight heads of 32, state 16), two of them
  ``hybrid``: the shared attention block (two heads of 128, read from ``[hidden, embeddings]``) before it;
* ``lfm2``: an LFM2 of four layers (``layer_types``: short conv, attention, two short convs; a conv window of
  three), with the ``conv_dim`` and ``block_dim`` fields published LFM2 configs carry and vLLM reads.

(OLMo-Hybrid's DeltaNet layer needs Triton, which the CPU build lacks; Jamba's Mamba1 layers fail in the CPU
engine's forward pass.)

``measure OUT``: load each in vLLM in-process (CPU, 1 GiB of KV, ``max_model_len`` 512) with the settings
of :data:`RUNS`, and print per run the block size, the groups (layer names), the blocks, the maximum
concurrency and the mamba cache mode. Used by ``test_state_layers.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import inprocess  # a sibling module: this script's folder is on sys.path
import transformers as tf

BASE: dict[str, Any] = {
    "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
    "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 1024,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
}  # fmt: skip
QWEN3_NEXT: dict[str, Any] = {
    "num_hidden_layers": 4, "full_attention_interval": 4, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1, "partial_rotary_factor": 0.25,
}  # fmt: skip
WIDE = {"linear_num_value_heads": 8, "linear_key_head_dim": 64, "linear_value_head_dim": 64}
NEMOTRON_H: dict[str, Any] = {
    "num_hidden_layers": 4, "hybrid_override_pattern": "M*M-", "mamba_num_heads": 4, "mamba_head_dim": 32,
    "n_groups": 1, "ssm_state_size": 16, "conv_kernel": 4, "expand": 1,
}  # fmt: skip
GRANITE: dict[str, Any] = {
    "num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"], "mamba_n_heads": 4,
    "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 1,
    "num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 64,
}  # fmt: skip
FALCON_H1: dict[str, Any] = {
    "num_hidden_layers": 2, "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_n_groups": 1, "mamba_d_state": 16,
    "mamba_d_conv": 4, "mamba_expand": 1, "mamba_d_ssm": 128, "mamba_rms_norm": True, "mamba_proj_bias": True,
    "projectors_bias": True,
}  # fmt: skip
ZAMBA2: dict[str, Any] = {
    "num_hidden_layers": 6, "layers_block_type": ["mamba", "hybrid", "mamba", "mamba", "hybrid", "mamba"],
    "num_key_value_heads": 2, "n_mamba_heads": 8, "mamba_ngroups": 1, "mamba_d_state": 16, "adapter_rank": 8,
    "tie_word_embeddings": True,  # transformers ties the shared blocks only with tied embeddings
}  # fmt: skip
LFM2: dict[str, Any] = {
    "num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "conv"], "conv_L_cache": 3,
    "conv_dim": 128, "block_dim": 128,
}  # fmt: skip
RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3next": ("qwen3next", {"mamba_ssm_cache_dtype": "float32"}),
    "qwen3next-wide": ("qwen3next-wide", {"mamba_ssm_cache_dtype": "bfloat16"}),
    "nemotronh": ("nemotronh", {}),  # the config's own SSM dtype (transformers writes float32)
    "nemotronh-no-prefix-caching": ("nemotronh", {"enable_prefix_caching": False}),
    "granite": ("granite", {"mamba_ssm_cache_dtype": "float32"}),  # the CPU's choice for Mamba2, said for all
    "granite-conv-fp32": ("granite", {"mamba_ssm_cache_dtype": "float32", "mamba_cache_dtype": "float32"}),
    "falconh1": ("falconh1", {"mamba_ssm_cache_dtype": "float32"}),
    "lfm2": ("lfm2", {}),
    "zamba2": ("zamba2", {"mamba_ssm_cache_dtype": "float32"}),
}


def make(tokenizer_dir: Path, root: Path) -> None:
    """The models (see the module docstring)."""
    models = {
        "qwen3next": tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**BASE, **QWEN3_NEXT)),
        "qwen3next-wide": tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**BASE, **(QWEN3_NEXT | WIDE))),
        "nemotronh": tf.NemotronHForCausalLM(tf.NemotronHConfig(**BASE, **NEMOTRON_H)),
        "granite": tf.GraniteMoeHybridForCausalLM(
            tf.GraniteMoeHybridConfig(**{k: v for k, v in BASE.items() if k != "head_dim"}, **GRANITE)
        ),
        "falconh1": tf.FalconH1ForCausalLM(tf.FalconH1Config(**BASE, **FALCON_H1)),
        "lfm2": tf.Lfm2ForCausalLM(tf.Lfm2Config(**BASE, **LFM2)),
        "zamba2": tf.Zamba2ForCausalLM(
            tf.Zamba2Config(
                **{k: v for k, v in BASE.items() if k not in ZAMBA2 and k != "head_dim"}, **ZAMBA2
            )
        ),
    }
    for name, model in models.items():
        inprocess.save_model(model, root / name, tokenizer_dir)


def view(worker: Any) -> dict[str, Any]:
    """The KV cache's block size, groups, blocks, maximum concurrency, mamba cache mode and state dtypes."""
    runner = worker.model_runner
    config, cache = runner.kv_cache_config, runner.cache_config
    return inprocess.pool_view(worker) | {
        "groups": [sorted(group.layer_names) for group in config.kv_cache_groups],
        "mamba_cache_mode": cache.mamba_cache_mode,
        "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype,
        "state_dtypes": sorted(
            {
                tuple(str(dtype).removeprefix("torch.") for dtype in group.kv_cache_spec.dtypes)
                for group in config.kv_cache_groups
                if hasattr(group.kv_cache_spec, "dtypes")
            }
        ),  # the conv and SSM states' dtypes of each state group (MambaSpec.dtypes)
    }


def measure(root: Path) -> None:
    """Print what the engine holds for each run of :data:`RUNS`."""
    common = {"max_model_len": 512, "dtype": "bfloat16", "max_num_seqs": 4}
    runs = [(label, common | {"model": str(root / model)} | extra) for label, (model, extra) in RUNS.items()]
    inprocess.print_engines("STATE", runs, view)


if __name__ == "__main__":
    inprocess.probe_main(make, measure)
