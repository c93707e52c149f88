"""kv-sidecar: predicts, watches and protects the KV cache of one vLLM server.

The package is split into a pure core (``sidecar.budget``: memory arithmetic with no I/O)
and thin edges (the command line in ``sidecar.cli``). See ``README.md`` for the tour.
"""

from importlib import metadata as _metadata

try:
    __version__: str = _metadata.version("kv-sidecar")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a bare source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
