"""Run with vLLM's python: a tiny Llama with three drafters of its own, and what vLLM makes of each.

``make TOKENIZER_DIR OUT``: in ``OUT``, a random-weight Llama of four layers (``target``: hidden 128, two
heads, one KV head of 64) and three drafters written as their published checkpoints are:

* ``eagle3``: ``LlamaForCausalLMEagle3`` with one ``midlayer`` whose QKV reads ``2 x hidden``, ``fc``
  ``3 x hidden -> hidden``, ``norm``, an ``lm_head`` over a 256-token draft vocabulary and the ``d2t`` /
  ``t2d`` maps (as yuhuili/EAGLE3-LLaMA3.1-Instruct-8B ships them);
* ``eagle``: an EAGLE-1 head (``LlamaForCausalLM`` config, ``layers.0`` without ``input_layernorm``, ``fc``
  ``2 x hidden -> hidden``) with a copy of the target's ``embed_tokens`` (as yuhuili/EAGLE-LLaMA3-Instruct-8B);
* ``draft``: a one-layer Llama with two KV heads, so its KV page is twice the target's.

A tiny Mixtral (``mixtral``) is made beside them: ``refused OUT`` asks vLLM for the EAGLE-3 head on it and
prints what it answers (Mixtral's class does not hand a drafter its hidden states).

``measure OUT``: load the target in vLLM in-process (CPU, 1 GiB of KV) without a drafter and with each, and
print as JSON per run the KV cache's block size, groups and blocks, and the names of the drafter's parameters
that are not the target's (the CPU backend repacks linear weights, so their sizes are read from the
checkpoint by the test, not here). Used by ``test_eagle_drafters.py``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import transformers as tf
from inprocess import drafter_view, print_engines  # a sibling module: this script's folder is on sys.path
from safetensors.torch import load_file, save_file

HIDDEN, HEAD, DRAFT_VOCAB = 128, 64, 256
BASE: dict[str, Any] = {
    "hidden_size": HIDDEN, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": HEAD,
    "intermediate_size": 256, "vocab_size": 512, "max_position_embeddings": 1024, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
}  # fmt: skip
SPECS: dict[str, dict[str, Any]] = {
    "eagle3": {"method": "eagle3", "model": "eagle3", "num_speculative_tokens": 2},
    "eagle": {"method": "eagle", "model": "eagle", "num_speculative_tokens": 2},
    "draft_model": {"method": "draft_model", "model": "draft", "num_speculative_tokens": 2},
}


def _random(*shape: int) -> torch.Tensor:
    return (torch.randn(*shape) * 0.02).to(torch.bfloat16)


def _ones(size: int) -> torch.Tensor:
    return torch.ones(size, dtype=torch.bfloat16)


def _layer(prefix: str, qkv_input: int, norms: tuple[str, ...]) -> dict[str, torch.Tensor]:
    q, kv = 2 * HEAD, 1 * HEAD
    tensors = {
        f"{prefix}.self_attn.q_proj.weight": _random(q, qkv_input),
        f"{prefix}.self_attn.k_proj.weight": _random(kv, qkv_input),
        f"{prefix}.self_attn.v_proj.weight": _random(kv, qkv_input),
        f"{prefix}.self_attn.o_proj.weight": _random(HIDDEN, q),
        f"{prefix}.mlp.gate_proj.weight": _random(256, HIDDEN),
        f"{prefix}.mlp.up_proj.weight": _random(256, HIDDEN),
        f"{prefix}.mlp.down_proj.weight": _random(HIDDEN, 256),
    }
    return tensors | {f"{prefix}.{norm}.weight": _ones(HIDDEN) for norm in norms}


def _save(out: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**BASE, "model_type": "llama", **config}, indent=1))


def make(tokenizer_dir: Path, root: Path) -> None:
    """The targets and the three drafters (see the module docstring)."""
    for name, layers, kv_heads in (("target", 4, 1), ("draft", 1, 2)):
        config = tf.LlamaConfig(**{**BASE, "num_hidden_layers": layers, "num_key_value_heads": kv_heads})
        tf.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(root / name)
    mixtral = tf.MixtralConfig(
        **{**BASE, "num_hidden_layers": 2, "num_local_experts": 4, "num_experts_per_tok": 2}
    )
    tf.MixtralForCausalLM(mixtral).to(torch.bfloat16).save_pretrained(root / "mixtral")
    for name in ("target", "draft", "mixtral"):
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tokenizer_dir / file, root / name / file)
    norms3 = ("input_layernorm", "post_attention_layernorm", "hidden_norm")
    eagle3 = _layer("midlayer", 2 * HIDDEN, norms3) | {
        "fc.weight": _random(HIDDEN, 3 * HIDDEN), "norm.weight": _ones(HIDDEN),
        "lm_head.weight": _random(DRAFT_VOCAB, HIDDEN), "d2t": torch.zeros(DRAFT_VOCAB, dtype=torch.long),
        "t2d": torch.ones(BASE["vocab_size"], dtype=torch.bool),
    }  # fmt: skip
    _save(root / "eagle3", eagle3, {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
                                    "draft_vocab_size": DRAFT_VOCAB})  # fmt: skip
    embeddings = load_file(root / "target" / "model.safetensors")["model.embed_tokens.weight"]
    eagle = _layer("layers.0", HIDDEN, ("post_attention_layernorm",)) | {
        "fc.weight": _random(HIDDEN, 2 * HIDDEN), "embed_tokens.weight": embeddings.clone(),
    }  # fmt: skip
    _save(root / "eagle", eagle, {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1})


def measure(root: Path) -> None:
    """Print what the engine holds without a drafter and with each."""
    common = {"model": str(root / "target"), "max_model_len": 512, "dtype": "bfloat16", "max_num_seqs": 4}
    runs = [("plain", common)] + [
        (label, common | {"speculative_config": spec | {"model": str(root / spec["model"])}})
        for label, spec in SPECS.items()
    ]
    print_engines("DRAFTER", runs, drafter_view)


def refused(root: Path) -> None:
    """Print how vLLM answers the EAGLE-3 head on a Mixtral, a class that does not feed EAGLE-3 heads."""
    spec = SPECS["eagle3"] | {"model": str(root / "eagle3")}
    common = {"model": str(root / "mixtral"), "max_model_len": 512, "dtype": "bfloat16", "max_num_seqs": 4}
    try:
        print_engines("DRAFTER", [("mixtral", common | {"speculative_config": spec})], drafter_view)
    except Exception as exc:  # noqa: BLE001 - what the engine says is the result
        print("REFUSED " + json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "make":
        make(Path(args[0]), Path(args[1]))
    elif command == "refused":
        refused(Path(args[0]))
    else:
        measure(Path(args[0]))
