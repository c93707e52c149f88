"""transformers' defaults for the config fields the planner reads, per ``model_type``.

A published ``config.json`` omits the fields whose values are its config class's defaults, and
transformers (so vLLM) fills them in when it loads the config: Gemma 3's ``text_config`` has no
``vocab_size`` because ``Gemma3TextConfig`` defaults it to 262,208. ``config_defaults.json`` is that
table, generated from transformers by ``scripts/gen_config_defaults.py`` (the integration tier checks
it is current), so the sidecar reads configs as transformers does without depending on it.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def _table() -> dict[str, dict[str, Any]]:
    text = resources.files("sidecar.budget").joinpath("config_defaults.json").read_text(encoding="utf-8")
    table: dict[str, dict[str, Any]] = json.loads(text)["model_types"]
    return table


def transformers_defaults(model_type: str) -> dict[str, Any]:
    """The defaults of ``model_type``'s config class (sub-configs nested), or ``{}`` for unknown types."""
    return dict(_table().get(model_type, {}))


def transformers_version() -> str:
    """The transformers release the table was generated from."""
    text = resources.files("sidecar.budget").joinpath("config_defaults.json").read_text(encoding="utf-8")
    return str(json.loads(text)["transformers"])
