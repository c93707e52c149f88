"""The prediction and the engine's report side by side: the input of :mod:`sidecar.monitor.diagnose`. Pure."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sidecar.budget.kv_terms import plan_gaps
from sidecar.budget.ledger import Ledger
from sidecar.signals.vllm import EngineSnapshot

if TYPE_CHECKING:
    from sidecar.monitor.diagnose import MonitorSettings


@dataclass(frozen=True, slots=True)
class Comparison:
    """Predicted and engine-reported figures side by side (``None`` where one side is unknown)."""

    predicted_pool_tokens: int | None
    engine_pool_tokens: int | None
    pool_drift_ratio: float | None
    predicted_max_concurrency: float | None
    engine_max_concurrency: float | None
    target_concurrency: int
    max_model_len: int | None
    requested_kv_dtype: str | None
    engine_kv_dtype: str | None
    vllm_release: str | None = None  # the release the prediction was made for
    plan_gaps: str | None = None  # what of the model the plan leaves out (kv_terms.plan_gaps)
    compiles: bool = True  # whether vLLM compiles the model in its start-up profile (not --enforce-eager)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _engine_max_concurrency(snapshot: EngineSnapshot, max_model_len: int | None) -> float | None:
    config = snapshot.cache_config
    if config is None:
        return None
    if config.kv_cache_max_concurrency is not None:
        return config.kv_cache_max_concurrency
    pool, block = config.pool_tokens, config.block_size
    if pool is None or not block or not max_model_len:
        return None
    return round(pool / (math.ceil(max_model_len / block) * block), 2)


def compare(
    ledger: Ledger | None,
    snapshot: EngineSnapshot | None,
    *,
    max_model_len: int | None,
    settings: MonitorSettings,
) -> Comparison:
    """Line up the prediction and the engine's report."""
    predicted_pool = ledger.kv_pool_tokens if ledger else None
    engine_pool = snapshot.cache_config.pool_tokens if snapshot and snapshot.cache_config else None
    drift = None
    if predicted_pool and engine_pool is not None:
        drift = (engine_pool - predicted_pool) / predicted_pool
    engine_dtype = snapshot.cache_config.cache_dtype if snapshot and snapshot.cache_config else None
    return Comparison(
        predicted_pool_tokens=predicted_pool,
        engine_pool_tokens=engine_pool,
        pool_drift_ratio=drift,
        predicted_max_concurrency=ledger.max_concurrency if ledger else None,
        engine_max_concurrency=_engine_max_concurrency(snapshot, max_model_len) if snapshot else None,
        target_concurrency=settings.target_concurrency,
        max_model_len=max_model_len,
        requested_kv_dtype=settings.requested_kv_dtype,
        engine_kv_dtype=engine_dtype,
        vllm_release=str(ledger.request.release) if ledger else None,
        compiles=not ledger.request.enforce_eager if ledger else True,
        plan_gaps=plan_gaps(ledger.request.architecture) if ledger else None,
    )
