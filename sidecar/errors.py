"""The project's typed errors.

Every error a user can cause derives from :class:`KvSidecarError` and carries a one-line
message that names the problem and what to do; the CLI prints that line and exits with
status 2 instead of showing a traceback.
"""

from __future__ import annotations


class KvSidecarError(Exception):
    """Root of every error kv-sidecar raises on purpose."""


class UsageError(KvSidecarError):
    """A flag, environment variable or argument has a value that cannot be used."""


class ConfigError(KvSidecarError):
    """A model ``config.json`` (or the directory holding it) cannot be read or understood."""


class UnknownModelError(ConfigError):
    """A ``--model`` value is neither a catalog id, a Hugging Face id we know, nor a path."""


class ModelUnavailableError(UnknownModelError):
    """A Hugging Face id whose files are neither in the local HF cache nor downloadable now."""


class UnknownGpuError(UsageError):
    """A ``--gpu`` value is not in the GPU catalog."""
