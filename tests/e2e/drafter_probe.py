"""Run with vLLM's python: a tiny DeepSeek-V3 with one MTP layer, and what vLLM makes of it.

``make TOKENIZER_DIR OUT``: a random-weight DeepSeek-V3 of two layers (one dense, one MoE, MLA attention)
with its MTP layer shipped beside it as the published checkpoints ship it (``model.layers.2.*``: the
decoder block, ``eh_proj``, ``enorm``, ``hnorm``, the shared head, and copies of the embeddings and LM head;
``num_nextn_predict_layers`` 1). ``measure MODEL``: load it in vLLM in-process (CPU), once with
``{"method": "mtp", "num_speculative_tokens": 1}`` and once without, and print as JSON the KV cache's
layers and blocks each time, the drafter's parameters that are not the target's, and the bytes of MLA's
decode copies of ``kv_b_proj`` (``W_UV``, ``W_UK_T``) in the target. Used by
``test_mtp_drafter.py``.
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

HIDDEN = 128
CONFIG: dict[str, Any] = {
    "hidden_size": HIDDEN, "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 512,
    "max_position_embeddings": 1024, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "intermediate_size": 256, "moe_intermediate_size": 64, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 64, "q_lora_rank": 96,
    "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64, "n_group": 1, "topk_group": 1,
    "topk_method": "noaux_tc", "scoring_func": "sigmoid",
}  # fmt: skip


def make(tokenizer_dir: Path, out: Path) -> None:
    """Three layers built by transformers; the last becomes the MTP layer, with its extra tensors."""
    model = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(num_hidden_layers=3, **CONFIG)).to(torch.bfloat16)
    model.save_pretrained(out)
    state = load_file(out / "model.safetensors")
    ones = torch.ones(HIDDEN, dtype=torch.bfloat16)
    state |= {
        "model.layers.2.enorm.weight": ones.clone(),
        "model.layers.2.hnorm.weight": ones.clone(),
        "model.layers.2.eh_proj.weight": torch.randn(HIDDEN, 2 * HIDDEN, dtype=torch.bfloat16) * 0.02,
        "model.layers.2.shared_head.norm.weight": ones.clone(),
        "model.layers.2.shared_head.head.weight": state["lm_head.weight"].clone(),
        "model.layers.2.embed_tokens.weight": state["model.embed_tokens.weight"].clone(),
    }
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config |= {"num_hidden_layers": 2, "num_nextn_predict_layers": 1}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)


def _engine_view(worker: Any) -> dict[str, Any]:
    view = drafter_view(worker)
    absorbed = sum(  # MLA's decode copies of kv_b_proj, made after loading
        p.numel() * p.element_size()
        for name, p in worker.model_runner.model.named_parameters()
        if name.endswith(("W_UV", "W_UK_T"))
    )
    return {
        **view,
        "kv_layers": sorted(name for group in view["groups"] for name in group),
        "absorbed": absorbed,
    }


def measure(model: str) -> None:
    """Print what the engine holds with the MTP drafter and without."""
    # The reference MLA backend, which keeps kv_b_proj's decode copies as a GPU's MLA backends do (and
    # 16-token blocks): on a CPU with AMX vLLM picks AMX_MLA for the model and the drafter alike (128-token
    # blocks, no copies; CpuPlatform.get_attn_backend_cls, 0.32.0), and asking for CPU_MLA reaches the
    # model but not the drafter. So the probe's process is told the CPU has no AMX tiles.
    torch.cpu._is_amx_tile_supported = lambda: False  # noqa: SLF001 - vLLM's own check, in this process only
    common = {"model": model, "max_model_len": 512, "dtype": "bfloat16", "max_num_seqs": 4}
    mtp = {"method": "mtp", "num_speculative_tokens": 1}
    print_engines("DRAFTER", [("mtp", common | {"speculative_config": mtp}), ("plain", common)], _engine_view)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "make":
        make(Path(args[0]), Path(args[1]))
    else:
        measure(args[0])
