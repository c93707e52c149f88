"""Models named by Hugging Face id: the files the planner reads, from the local HF cache or the Hub.

``huggingface_hub`` does the work, so the sidecar finds exactly what vLLM downloaded: its cache
layout (``HF_HOME``, ``HF_HUB_CACHE``), revisions (``--revision``, as vLLM's flag), offline mode
(``HF_HUB_OFFLINE``) and the token (``HF_TOKEN``) are the library's. Only the small planning files
are ever downloaded (:data:`PLANNING_FILES`: config, tokenizer, chat template, the safetensors
index); never weights. The exact parameter count comes from the weights' safetensors headers when
vLLM has cached them, else from the Hub's safetensors metadata (one small request), else from the
config.

:func:`hub_snapshot` is blocking I/O: ``kv-sidecar run`` calls it in a worker thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.errors import ModelUnavailableError

PLANNING_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "additional_chat_templates/*.jinja",
    "processor_config.json",
    "preprocessor_config.json",
    "model.safetensors.index.json",
)
"""The files fetched for planning: small JSON and text, never weights."""

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def looks_like_hub_id(text: str) -> bool:
    """Whether ``text`` has the shape of a Hub repository id (``org/name``)."""
    return bool(_REPO_ID.match(text.strip())) and ".." not in text


@dataclass(frozen=True, slots=True)
class HubSnapshot:
    """A model's planning files in a local folder, and where they came from."""

    repo_id: str
    revision: str | None
    directory: Path
    source: str  # "hf-cache" or "hub"
    hub_metadata: Any = None  # the Hub's safetensors metadata (tensor names and sizes), when fetched


def _offline() -> bool:
    from huggingface_hub import constants  # noqa: PLC0415 - imported when a Hub id is used

    return bool(constants.HF_HUB_OFFLINE)


def _cached(repo_id: str, revision: str | None, cache_dir: Path | None) -> Path | None:
    from huggingface_hub import snapshot_download  # noqa: PLC0415
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError  # noqa: PLC0415

    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True,
            allow_patterns=list(PLANNING_FILES),
        )  # fmt: skip
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    path = Path(str(folder))
    return path if (path / "config.json").is_file() else None


def _downloaded(repo_id: str, revision: str | None, cache_dir: Path | None) -> HubSnapshot:
    from huggingface_hub import HfApi, snapshot_download  # noqa: PLC0415
    from huggingface_hub.errors import (  # noqa: PLC0415
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = Path(
            str(
                snapshot_download(
                    repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=list(PLANNING_FILES)
                )
            )
        )
    except GatedRepoError:
        raise ModelUnavailableError(
            f"{repo_id} is gated on the Hugging Face Hub: accept its licence and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ModelUnavailableError(
            f"{repo_id} is not on the Hugging Face Hub (or is private: set HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ModelUnavailableError(f"{repo_id} has no revision {revision!r}") from None
    except (HfHubHTTPError, OSError) as exc:
        raise ModelUnavailableError(
            f"cannot download {repo_id}'s config.json ({type(exc).__name__}): "
            "mount the HF cache vLLM uses, or check the network"
        ) from None
    if not (folder / "config.json").is_file():
        raise ModelUnavailableError(f"{repo_id} has no config.json: is it a transformers model?")
    try:
        metadata = HfApi().get_safetensors_metadata(repo_id, revision=revision)
    except Exception:  # noqa: BLE001 - the count is optional: the config's arithmetic stands in
        metadata = None
    return HubSnapshot(repo_id, revision, folder, "hub", metadata)


def hub_snapshot(
    repo_id: str, revision: str | None = None, *, cache_dir: Path | None = None, offline: bool | None = None
) -> HubSnapshot:
    """The model's planning files: the local HF cache first, else the Hub unless offline.

    Raises :class:`~sidecar.errors.ModelUnavailableError` with one line saying what to do.
    """
    folder = _cached(repo_id, revision, cache_dir)
    if folder is not None:
        return HubSnapshot(repo_id, revision, folder, "hf-cache")
    if _offline() if offline is None else offline:
        where = str(cache_dir) if cache_dir else "the HF cache (HF_HOME / HF_HUB_CACHE)"
        raise ModelUnavailableError(
            f"{repo_id} is not in {where} and HF_HUB_OFFLINE is set: "
            "mount the cache vLLM downloads into, or allow downloads"
        )
    return _downloaded(repo_id, revision, cache_dir)
