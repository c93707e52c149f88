"""What vLLM's model classes declare, read from its registry: ``vllm_model_classes.json``.

``scripts/gen_vllm_model_classes.py`` writes the table with vLLM's python (the e2e tier checks that it is
current); the sidecar reads it here, without vLLM. It lists every class that imports in the CPU build of the
release it names (most multimodal classes need torchvision and are missing): for each, whether it supports
LoRA and how (:mod:`sidecar.budget.lora`), and whether it can serve an EAGLE-3 head (``SupportsEagle3``).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def vllm_class_table() -> dict[str, Any]:
    """The table, parsed once."""
    text = resources.files("sidecar.budget").joinpath("vllm_model_classes.json").read_text(encoding="utf-8")
    table: dict[str, Any] = json.loads(text)
    return table


def vllm_class_table_version() -> str:
    """The vLLM release the table was read from."""
    return str(vllm_class_table()["vllm_version"])


def serves_eagle3(class_name: str | None) -> bool | None:
    """Whether vLLM's ``class_name`` feeds an EAGLE-3 head its hidden states (``None``: not in the table)."""
    table = vllm_class_table()
    known = class_name is not None and (
        class_name in table["with_lora"] or class_name in table["without_lora"]
    )
    if not known:
        return None
    return class_name in table["eagle3_targets"]


def state_class(class_name: str | None) -> str | None:
    """``hybrid`` or ``attention_free`` for a class that keeps a recurrent state per sequence, else ``None``.

    vLLM's ``IsHybrid`` (state layers beside attention) and ``IsAttentionFree`` (state layers only).
    """
    kinds: dict[str, list[str]] = vllm_class_table()["state_classes"]
    return next((kind for kind, names in kinds.items() if class_name in names), None)
