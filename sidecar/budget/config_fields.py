"""Reading a ``config.json`` and its whole-number fields the way the planner's modules all do."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError


def first_int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    """The first of ``keys`` present in ``cfg`` as a whole number (``8`` or ``8.0``), else ``None``.

    A present field that is not a whole number is a one-line :class:`~sidecar.errors.ConfigError`.
    """
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
                raise ConfigError(f"config.json field {key!r} must be a whole number, got {value!r}")
            return int(value)
    return None


def as_number(value: object) -> float | None:
    """``value`` as a float when it is a number (not a bool), else ``None``."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def int_field(cfg: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    """The first of ``keys`` that ``cfg`` holds as an integer (not a bool), else ``default``.

    The lenient reading of the towers' modules, where a field transformers types as ``int | list`` may hold
    a list that the formula reads otherwise, and a missing field takes its config class's default.
    """
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


VLLM_ATTRIBUTE_RENAMES = {"llm_config": "text_config"}
"""Top-level fields vLLM 0.32.0 reads under another name (``_CONFIG_ATTRS_MAPPING``,
``vllm/transformers_utils/config.py``): InternVL's original checkpoints, NVLM-D and Nemotron Nano VL keep
their language model under ``llm_config``."""


def with_vllm_names(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config`` with the fields vLLM renames under the names it reads them by (a present name wins)."""
    renamed = {
        new: config[old] for old, new in VLLM_ATTRIBUTE_RENAMES.items() if old in config and new not in config
    }
    return {**config, **renamed} if renamed else config


def read_config_file(path: Path) -> dict[str, Any]:
    """Read and decode one ``config.json``, turning every failure into a one-line :class:`ConfigError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text: point --model at a config.json") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return data
