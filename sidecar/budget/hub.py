"""Models named by Hugging Face id: the files the planner reads, from the local HF cache or the Hub.

``huggingface_hub`` does the work, so the sidecar finds exactly what vLLM downloaded: its cache
layout (``HF_HOME``, ``HF_HUB_CACHE``), revisions (``--revision``, as vLLM's flag), offline mode
(``HF_HUB_OFFLINE``) and the token (``HF_TOKEN``) are the library's. Only the small planning files
are ever downloaded (:data:`PLANNING_FILES`: config, tokenizer, chat template, the safetensors
index); never weights. The exact parameter count comes from the weights' safetensors headers when
vLLM has cached them, else from the Hub's safetensors metadata (one small request), else from the
config.

:func:`tokenizer_folder` finds vLLM's ``--tokenizer`` repository the same way. Both are blocking I/O:
``kv-sidecar run`` calls them in a worker thread.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.admission.tokenizer_mode import MISTRAL_TOKENIZER_FILES  # a leaf module: its rule's files
from sidecar.errors import ConfigError, ModelUnavailableError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "additional_chat_templates/*.jinja",
    "processor_config.json",
    "preprocessor_config.json",
    *MISTRAL_TOKENIZER_FILES,
)
"""The files prompts are counted with: the tokenizer, its chat templates, a processor's template, and the
Mistral tokenizers whose presence makes vLLM use mistral_common (``resolve_tokenizer_args``)."""

PLANNING_FILES = ("config.json", *TOKENIZER_FILES, "model.safetensors.index.json")
"""The files fetched for planning and counting: small JSON and text, never weights."""

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


def _has_config(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


def _cached(
    repo_id: str, revision: str | None, cache_dir: Path | None, files: tuple[str, ...] = PLANNING_FILES,
    usable: Callable[[Path], bool] = _has_config,
) -> Path | None:  # fmt: skip
    from huggingface_hub import snapshot_download  # noqa: PLC0415
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError  # noqa: PLC0415

    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True, allow_patterns=list(files)
        )
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    path = Path(str(folder))
    return path if usable(path) else None


def _download(repo_id: str, revision: str | None, cache_dir: Path | None, files: tuple[str, ...]) -> Path:
    """``files`` of the repository downloaded into the cache; one line saying what to do when it fails."""
    from huggingface_hub import snapshot_download  # noqa: PLC0415
    from huggingface_hub.errors import (  # noqa: PLC0415
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(
            str(
                snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=list(files))
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
            f"cannot download {repo_id}'s files ({type(exc).__name__}): "
            "mount the HF cache vLLM uses, or check the network"
        ) from None


def _downloaded(repo_id: str, revision: str | None, cache_dir: Path | None) -> HubSnapshot:
    from huggingface_hub import HfApi  # noqa: PLC0415

    folder = _download(repo_id, revision, cache_dir, PLANNING_FILES)
    if not _has_config(folder):
        raise ModelUnavailableError(f"{repo_id} has no config.json: is it a transformers model?")
    try:
        metadata = HfApi().get_safetensors_metadata(repo_id, revision=revision)
    except Exception:  # noqa: BLE001 - the count is optional: the config's arithmetic stands in
        metadata = None
    return HubSnapshot(repo_id, revision, folder, "hub", metadata)


def _not_cached(repo_id: str, cache_dir: Path | None) -> ModelUnavailableError:
    where = str(cache_dir) if cache_dir else "the HF cache (HF_HOME / HF_HUB_CACHE)"
    return ModelUnavailableError(
        f"{repo_id} is not in {where} and HF_HUB_OFFLINE is set: "
        "mount the cache vLLM downloads into, or allow downloads"
    )


def tokenizer_folder(
    repo_id: str, revision: str | None = None, *, cache_dir: Path | None = None, offline: bool | None = None
) -> Path:
    """The tokenizer files of vLLM's ``--tokenizer`` repository: the HF cache, else the Hub unless offline.

    vLLM fetches that repository's tokenizer files into the same cache as it loads the tokenizer (with
    transformers, or mistral_common); the sidecar needs :data:`TOKENIZER_FILES`. Raises
    :class:`~sidecar.errors.ModelUnavailableError` with one line.
    """
    folder = _cached(repo_id, revision, cache_dir, TOKENIZER_FILES, _has_tokenizer)
    if folder is not None:
        return folder
    if _offline() if offline is None else offline:
        raise _not_cached(repo_id, cache_dir)
    folder = _download(repo_id, revision, cache_dir, TOKENIZER_FILES)
    if not _has_tokenizer(folder):
        raise ModelUnavailableError(f"{repo_id} has no tokenizer.json or tokenizer_config.json")
    return folder


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
        raise _not_cached(repo_id, cache_dir)
    return _downloaded(repo_id, revision, cache_dir)


def resolve_tokenizer(
    text: str, revision: str | None = None, *, cache_dir: Path | None = None, offline: bool | None = None
) -> Path:
    """Resolve vLLM's ``--tokenizer``: a folder (or a file in one), else a Hub id (:func:`tokenizer_folder`).

    Raises :class:`~sidecar.errors.ConfigError` (or its ``ModelUnavailableError``) with one line.
    """
    path = Path(text).expanduser()
    if path.exists():
        return path if path.is_dir() else path.parent
    if not looks_like_hub_id(text):
        raise ConfigError(f"--tokenizer {text!r} is not a folder and not a Hugging Face id (org/name)")
    return tokenizer_folder(text.strip(), revision, cache_dir=cache_dir, offline=offline)
