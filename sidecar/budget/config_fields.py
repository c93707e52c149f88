"""Reading a ``config.json``'s whole-number fields the way the planner's modules all do. Pure."""

from __future__ import annotations

from collections.abc import Mapping
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
