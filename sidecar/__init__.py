"""kv-sidecar: predicts, watches and protects the KV cache of one vLLM server (or SGLang, TensorRT-LLM).

Layers, each importing only the ones before it: ``budget`` (the memory arithmetic, pure), ``signals``
(engines' metrics pages into one snapshot, pure), ``monitor`` (prediction against the engine,
diagnoses; the scraper and NVML reader at its edge), ``admission`` (what to admit, pure, with its
async controller), ``server`` (the proxy, the admin server, the gateway view, every metric family).
``settings`` holds the settings types the command line (``cli``, ``flags``) and the server share;
``app`` wires one of everything. See ``README.md`` for the tour.
"""

from importlib import metadata as _metadata

try:
    __version__: str = _metadata.version("kv-sidecar")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a bare source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
