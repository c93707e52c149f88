"""The tensors a generated ``model.safetensors`` holds, read from its header (no weights loaded)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

ELEMENT_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "BOOL": 1}


def tensor_bytes(folder: Path) -> dict[str, int]:
    """Each tensor's name and size in bytes, from ``folder/model.safetensors``'s header."""
    raw = (folder / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    return {
        name: ELEMENT_BYTES[entry["dtype"]] * math.prod(entry["shape"])
        for name, entry in header.items()
        if name != "__metadata__"
    }
