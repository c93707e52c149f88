"""Embedded, offline catalogs: known models (their public ``config.json``) and known GPUs.

Model ids are the lower-case model name without organisation and without an ``-Instruct``
suffix (``qwen2.5-7b``); the full Hugging Face id (``Qwen/Qwen2.5-7B-Instruct``) resolves too.
Each model's ``config.json`` is stored under ``models/`` exactly as published (Gemma 3's
text defaults written out). :func:`resolve_model_source` also accepts a model directory, a
``config.json`` path, or any Hugging Face id (read from the local HF cache, else downloaded:
:mod:`sidecar.budget.hub`).

GPU sizes are the totals the driver reports (``nvidia-smi``'s "MiB" total, the figure vLLM
sees as total memory), which are a little below the marketing capacity on some cards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from sidecar.budget.architecture import (
    Architecture,
    architecture_from_config,
    load_architecture,
    read_config_file,
    unloaded_tensors,
)
from sidecar.budget.drafters import Drafter
from sidecar.budget.hub import HubSnapshot, hub_snapshot, looks_like_hub_id
from sidecar.budget.safetensors import hub_parameter_count
from sidecar.budget.speculative import DRAFTLESS_METHODS, SpeculativeSettings
from sidecar.errors import ConfigError, ModelUnavailableError, UnknownGpuError, UnknownModelError
from sidecar.units import MIB


@dataclass(frozen=True, slots=True)
class CatalogModel:
    """One catalog entry: its id, the Hugging Face repository and the published parameter count."""

    id: str
    hf_id: str
    published_parameters: float  # as the model card states it, in parameters


MODELS: Final[tuple[CatalogModel, ...]] = (
    CatalogModel("llama-2-7b", "meta-llama/Llama-2-7b-hf", 6.74e9),
    CatalogModel("llama-2-13b", "meta-llama/Llama-2-13b-hf", 13.0e9),
    CatalogModel("llama-3-8b", "meta-llama/Meta-Llama-3-8B-Instruct", 8.03e9),
    CatalogModel("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 8.03e9),
    CatalogModel("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 70.6e9),
    CatalogModel("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3", 7.25e9),
    CatalogModel("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7e9),
    CatalogModel("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", 0.49e9),
    CatalogModel("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", 1.54e9),
    CatalogModel("qwen2.5-3b", "Qwen/Qwen2.5-3B-Instruct", 3.09e9),
    CatalogModel("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 7.61e9),
    CatalogModel("qwen2.5-14b", "Qwen/Qwen2.5-14B-Instruct", 14.7e9),
    CatalogModel("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct", 32.5e9),
    CatalogModel("qwen3-8b", "Qwen/Qwen3-8B", 8.2e9),
    CatalogModel("gemma-2-9b", "google/gemma-2-9b-it", 9.24e9),
    CatalogModel("gemma-3-4b", "google/gemma-3-4b-it", 4.30e9),  # its SigLIP tower and projector: 0.42B
    CatalogModel("deepseek-v3", "deepseek-ai/DeepSeek-V3", 671e9),
)
"""Every model the catalog knows."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU model, the memory its driver reports as total, and whether it computes in FP8."""

    id: str
    name: str
    memory_bytes: int
    fp8: bool  # FP8 tensor cores: compute capability 8.9 (Ada) or 9.0+ (Hopper); Ampere (8.0, 8.6) has none


GPUS: Final[tuple[Gpu, ...]] = (
    Gpu("rtx3090", "NVIDIA GeForce RTX 3090", 24576 * MIB, fp8=False),
    Gpu("rtx4090", "NVIDIA GeForce RTX 4090", 24564 * MIB, fp8=True),
    Gpu("l4", "NVIDIA L4", 23034 * MIB, fp8=True),
    Gpu("a10", "NVIDIA A10", 23028 * MIB, fp8=False),
    Gpu("l40s", "NVIDIA L40S", 46068 * MIB, fp8=True),
    Gpu("rtx-a6000", "NVIDIA RTX A6000", 49140 * MIB, fp8=False),
    Gpu("a100-40gb", "NVIDIA A100 40GB", 40960 * MIB, fp8=False),
    Gpu("a100-80gb", "NVIDIA A100 80GB", 81920 * MIB, fp8=False),
    Gpu("h100", "NVIDIA H100 80GB", 81559 * MIB, fp8=True),
    Gpu("h200", "NVIDIA H200", 143771 * MIB, fp8=True),
    Gpu("b200", "NVIDIA B200", 183359 * MIB, fp8=True),  # nvidia-smi's total; compute capability 10.0
)
"""Every GPU the catalog knows."""

_GPU_ALIASES: Final[dict[str, str]] = {
    "3090": "rtx3090",
    "4090": "rtx4090",
    "a6000": "rtx-a6000",
    "rtxa6000": "rtx-a6000",
    "a100-40g": "a100-40gb",
    "a100-80g": "a100-80gb",
    "h100-80gb": "h100",
    "h100-sxm": "h100",
}


def _model_key(text: str) -> str:
    name = text.strip().rsplit("/", 1)[-1].lower()
    for suffix in ("-instruct", "-it", "-chat", "-hf"):
        name = name.removesuffix(suffix)
    return name.removeprefix("meta-")


def _catalog_config(model_id: str) -> dict[str, object]:
    data = (
        resources.files("sidecar.budget").joinpath("models", f"{model_id}.json").read_text(encoding="utf-8")
    )
    parsed: dict[str, object] = json.loads(data)
    return parsed


def find_catalog_model(text: str) -> CatalogModel | None:
    """The catalog entry a catalog id or Hugging Face id names, or ``None``."""
    key = _model_key(text)
    for model in MODELS:
        if key in {model.id, _model_key(model.hf_id)} or text.strip().lower() == model.hf_id.lower():
            return model
    return None


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """What ``--model`` resolved to: the architecture, the folder of its files (if any), and from where."""

    architecture: Architecture
    directory: Path | None  # the model directory or HF snapshot (tokenizer and chat template live there)
    source: str  # "path", "hf-cache", "hub" or "catalog"


def _from_catalog(model: CatalogModel) -> ResolvedModel:
    try:
        return ResolvedModel(architecture_from_config(_catalog_config(model.id)), None, "catalog")
    except (OSError, ValueError) as exc:  # pragma: no cover - the package is broken
        raise ConfigError(f"catalog entry {model.id} is unreadable: {exc}") from None


def _from_snapshot(snapshot: HubSnapshot) -> ResolvedModel:
    architecture = load_architecture(snapshot.directory)
    skipped = unloaded_tensors(architecture)
    count = hub_parameter_count(snapshot.hub_metadata, skipped) if snapshot.hub_metadata else None
    if architecture.parameter_source.startswith("computed") and count and not architecture.packed_weights:
        architecture = architecture.with_parameter_count(count, "the Hub's safetensors metadata")
    return ResolvedModel(architecture, snapshot.directory, snapshot.source)


def resolve_model_source(
    text: str, revision: str | None = None, *, cache_dir: Path | None = None, offline: bool | None = None
) -> ResolvedModel:
    """Resolve ``--model``: a path; else a Hub id from the local HF cache; else the catalog; else the Hub.

    The HF cache goes before the catalog because it holds the exact revision vLLM serves (and,
    once vLLM has downloaded them, the weights whose headers give the exact parameter count); the
    catalog goes before a download so that a catalog model never needs the network.
    """
    path = Path(text).expanduser()
    if path.exists():
        return ResolvedModel(load_architecture(path), path if path.is_dir() else path.parent, "path")
    model = find_catalog_model(text)
    if looks_like_hub_id(text):
        try:
            return _from_snapshot(hub_snapshot(text.strip(), revision, cache_dir=cache_dir, offline=True))
        except ModelUnavailableError:
            if model is not None:
                return _from_catalog(model)
        return _from_snapshot(hub_snapshot(text.strip(), revision, cache_dir=cache_dir, offline=offline))
    if model is None:
        known = ", ".join(m.id for m in MODELS)
        raise UnknownModelError(
            f"unknown model {text!r}: not a file or directory, not a Hugging Face id (org/name), "
            f"not a catalog id ({known})"
        )
    return _from_catalog(model)


def _drafter_config(text: str, cache_dir: Path | None) -> dict[str, object]:
    path = Path(text).expanduser()
    if path.exists():
        return read_config_file(path / "config.json" if path.is_dir() else path)
    if not looks_like_hub_id(text):
        raise ConfigError(f"{text!r} is not a file, a directory or a Hugging Face id (org/name)")
    try:
        snapshot = hub_snapshot(text, cache_dir=cache_dir, offline=True)
    except ModelUnavailableError:
        snapshot = hub_snapshot(text, cache_dir=cache_dir)
    return read_config_file(snapshot.directory / "config.json")


def resolve_drafter(
    spec: SpeculativeSettings | None, *, cache_dir: Path | None = None
) -> SpeculativeSettings | None:
    """``spec`` with its drafter's ``config.json`` read, as ``--model`` is resolved; never raises.

    A drafter that cannot be read leaves the plan without its memory and says why in the plan's notes
    (vLLM would still serve it, so the sidecar does not refuse it).
    """
    if spec is None or spec.model is None or spec.method in DRAFTLESS_METHODS or spec.multi_token_prediction:
        return spec
    try:
        return spec.with_drafter(Drafter.from_config(_drafter_config(spec.model, cache_dir)))
    except ConfigError as exc:
        return spec.with_drafter(None, str(exc))


def resolve_model(text: str, revision: str | None = None) -> Architecture:
    """The architecture ``--model`` names (see :func:`resolve_model_source`)."""
    return resolve_model_source(text, revision).architecture


_AMBIGUOUS_GPUS: Final[dict[str, tuple[str, ...]]] = {"a100": ("a100-40gb", "a100-80gb")}


def find_gpu(gpu_id: str) -> Gpu | None:
    """The catalog GPU with this id, or ``None``."""
    return next((g for g in GPUS if g.id == gpu_id), None)


def resolve_gpu(text: str) -> Gpu:
    """The catalog GPU ``--gpu`` names (``rtx4090``, ``RTX 4090``, ``a100-80gb``, ``h100`` ...)."""
    key = text.strip().lower().replace(" ", "").replace("_", "-").removeprefix("nvidia")
    if key in _AMBIGUOUS_GPUS:
        raise UnknownGpuError(f"--gpu {text} is ambiguous: use {' or '.join(_AMBIGUOUS_GPUS[key])}")
    key = _GPU_ALIASES.get(key, key)
    for gpu in GPUS:
        if key in {gpu.id, gpu.id.replace("-", "")}:
            return gpu
    known = ", ".join(g.id for g in GPUS)
    raise UnknownGpuError(f"unknown GPU {text!r}: use one of {known}, or give --gpu-memory such as 24GiB")
