"""Exact parameter counts from the weight files of a model directory.

A safetensors file starts with an 8-byte little-endian header length and a JSON header that
lists every tensor's dtype and shape, so the parameter count is exact without loading a single
weight. When the directory has no ``*.safetensors`` files but has ``model.safetensors.index.json``,
its ``metadata.total_size`` (bytes of all tensors) divided by the bytes per element of the
config's dtype gives the count instead.

**Tensors vLLM does not load.** Checkpoints with multi-token-prediction layers ship them beside the
model: DeepSeek-V3/R1 and GLM-4.5 as ``model.layers.{N}.`` for ``N`` from ``num_hidden_layers`` on
(``num_nextn_predict_layers`` of them), Qwen3-Next and Qwen3.5 under ``mtp.``, MiMo under
``model.mtp_layers.``. vLLM's model skips them unless it serves them as a speculative drafter
(``get_spec_layer_idx_from_weight_name``, ``vllm/model_executor/models/utils.py``, called from
``DeepseekV2ForCausalLM.load_weights``; the ``WeightsMapper`` prefixes mapped to ``None`` in
``qwen3_next.py``, ``qwen3_5.py``, ``mimo.py``; 0.32.0 as installed), so they are not counted: DeepSeek-V3's
headers sum to about 685B parameters, the model vLLM loads has 671B. An index whose ``weight_map`` lists such
tensors has a ``total_size`` that counts them, so it gives no count (the config's arithmetic stands in).

**Packed weights.** A header counts elements, and AWQ, GPTQ, bitsandbytes 4-bit, MXFP4 and other 4-bit
formats store several weights in one (:func:`sidecar.budget.quantization.packs_weights`); the callers do not
ask for a count from such checkpoints (``Architecture.packed_weights``).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from sidecar.budget.dtypes import WEIGHT_DTYPES, normalise_dtype
from sidecar.errors import ConfigError

_MAX_HEADER_BYTES = 100 * 1024 * 1024
_INDEX_NAME = "model.safetensors.index.json"
DRAFT_PREFIXES: Final = ("mtp.", "model.mtp_layers.")
"""Name prefixes of multi-token-prediction tensors that vLLM's models map to nothing (see the docstring)."""

TensorFilter = Callable[[str], bool]


def draft_tensor_filter(num_layers: int, draft_layers: int, *, host_tables: bool = False) -> TensorFilter:
    """Whether a checkpoint tensor belongs to the draft (MTP) layers vLLM's model skips.

    ``host_tables``: DeepSeek-V4.1's n-gram tables (``layers.N.engram.embed.*``), which vLLM keeps in pinned
    host memory by default (``EngramConfig.cpu_offload``), are left out too.
    """
    layer_prefixes = tuple(
        f"{root}{index}."
        for index in range(num_layers, num_layers + draft_layers)
        for root in ("model.layers.", "layers.", "model.language_model.layers.")
    )
    prefixes = DRAFT_PREFIXES + layer_prefixes

    def skipped(name: str) -> bool:
        return name.startswith(prefixes) or (host_tables and ".engram.embed." in name)

    return skipped


def _keep_all(name: str) -> bool:
    return False


def _header_parameter_count(path: Path, skipped: TensorFilter) -> int:
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
        if name == "__metadata__" or skipped(name):
            continue
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if not isinstance(shape, list):
            raise ConfigError(f"{path}: tensor {name!r} has no shape in its header")
        total += math.prod(int(dim) for dim in shape)
    return total


def measured_parameter_count(
    directory: Path, dtype: str, skipped: TensorFilter = _keep_all
) -> tuple[int, str] | None:
    """The model's parameter count and where it came from, or ``None`` when the files do not give one.

    ``skipped``: tensors vLLM does not load (:func:`draft_tensor_filter`), left out of the count.
    """
    shards = sorted(directory.glob("*.safetensors"))
    if shards:
        total = sum(_header_parameter_count(p, skipped) for p in shards)
        return total, f"safetensors headers ({len(shards)} files)"
    index_path = directory / _INDEX_NAME
    if not index_path.is_file():
        return None
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        total_size = int(index["metadata"]["total_size"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{index_path} has no readable metadata.total_size") from None
    weight_map = index.get("weight_map")
    if isinstance(weight_map, dict) and any(skipped(str(name)) for name in weight_map):
        return None  # total_size counts tensors vLLM does not load
    bytes_per_element = WEIGHT_DTYPES.get(normalise_dtype(dtype), 2.0)
    return int(total_size / bytes_per_element), f"{_INDEX_NAME} total_size"


def hub_parameter_count(metadata: Any, skipped: TensorFilter = _keep_all) -> int | None:
    """Parameters in the Hub's safetensors metadata (``HfApi.get_safetensors_metadata``), less ``skipped``."""
    try:
        total = sum(
            int(info.parameter_count)
            for file in metadata.files_metadata.values()
            for name, info in file.tensors.items()
            if not skipped(name)
        )
    except (AttributeError, TypeError, ValueError):
        return None
    return total or None
