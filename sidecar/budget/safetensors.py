"""Exact parameter counts from the weight files of a model directory.

A safetensors file starts with an 8-byte little-endian header length and a JSON header that
lists every tensor's dtype and shape, so the parameter count is exact without loading a single
weight. When the directory has no ``*.safetensors`` files but has ``model.safetensors.index.json``,
its ``metadata.total_size`` (bytes of all tensors) divided by the bytes per element of the
config's dtype gives the count instead.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from sidecar.budget.dtypes import WEIGHT_DTYPES, normalise_dtype
from sidecar.errors import ConfigError

_MAX_HEADER_BYTES = 100 * 1024 * 1024
_INDEX_NAME = "model.safetensors.index.json"


def _header_parameter_count(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            raw_length = handle.read(8)
            if len(raw_length) != 8:
                raise ConfigError(f"{path} is too short to be a safetensors file")
            (length,) = struct.unpack("<Q", raw_length)
            if length > _MAX_HEADER_BYTES:
                raise ConfigError(f"{path} declares a {length}-byte header: the file is not safetensors")
            header = json.loads(handle.read(length))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the safetensors header of {path}: {exc}") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{path} has a safetensors header that is not a JSON object")
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list):
            raise ConfigError(f"{path}: tensor {name!r} has no shape in its header")
        total += math.prod(int(dim) for dim in shape)
    return total


def measured_parameter_count(directory: Path, dtype: str) -> tuple[int, str] | None:
    """The model's parameter count and where it came from, or ``None`` when there are no weight files."""
    shards = sorted(directory.glob("*.safetensors"))
    if shards:
        return sum(_header_parameter_count(p) for p in shards), f"safetensors headers ({len(shards)} files)"
    index_path = directory / _INDEX_NAME
    if not index_path.is_file():
        return None
    try:
        total_size = int(json.loads(index_path.read_text(encoding="utf-8"))["metadata"]["total_size"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{index_path} has no readable metadata.total_size") from None
    bytes_per_element = WEIGHT_DTYPES.get(normalise_dtype(dtype), 2.0)
    return int(total_size / bytes_per_element), f"{_INDEX_NAME} total_size"
