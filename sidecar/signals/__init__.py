"""Engine signals: a fast Prometheus text scanner and vLLM's metric families mapped to a snapshot."""

from sidecar.signals.scan import MetricsParseError, Sample, scan
from sidecar.signals.vllm import CacheConfig, EngineSnapshot, EngineValues, parse_vllm_metrics

__all__ = [
    "CacheConfig",
    "EngineSnapshot",
    "EngineValues",
    "MetricsParseError",
    "Sample",
    "parse_vllm_metrics",
    "scan",
]
