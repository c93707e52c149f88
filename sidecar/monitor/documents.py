"""The monitor's state as JSON: ``GET /budget`` and ``kv-sidecar check --format json`` share it."""

from __future__ import annotations

import math
from typing import Any

from sidecar.budget.report import ledger_to_dict
from sidecar.monitor.monitor import Monitor


def finite(value: float | None) -> float | None:
    """``value``, or ``None`` for a missing or non-finite one (JSON has no infinity)."""
    return None if value is None or not math.isfinite(value) else value


def budget_document(monitor: Monitor) -> dict[str, Any]:
    """``GET /budget``: the prediction next to the engine's report, and the diagnoses."""
    snapshot = monitor.engine.snapshot
    config = snapshot.cache_config if snapshot else None
    return {
        "predicted": ledger_to_dict(monitor.ledger, []) if monitor.ledger else None,
        "prediction_error": monitor.model_error or monitor.plan_error,
        "model": {
            "requested": monitor.inputs.model,
            "resolved_from": monitor.model_source,
            "error": monitor.model_error,
        },
        "engine": {
            "kv_pool_tokens": config.pool_tokens if config else None,
            "num_gpu_blocks": config.num_gpu_blocks if config else None,
            "block_size": config.block_size if config else None,
            "cache_dtype": config.cache_dtype if config else None,
            "gpu_memory_utilization": config.gpu_memory_utilization if config else None,
            "kv_cache_memory_bytes": config.kv_cache_memory_bytes if config else None,
            "max_concurrency": monitor.comparison.engine_max_concurrency,
            "max_model_len": monitor.engine.max_model_len,
            "model": monitor.engine.served_model or (snapshot.model_name if snapshot else None),
        },
        "comparison": monitor.comparison.to_dict(),
        "diagnoses": [d.to_dict() for d in monitor.diagnoses],
    }
