"""vLLM's ``/metrics`` families mapped to an :class:`EngineSnapshot`.

Both current and older names are accepted: KV usage is ``vllm:kv_cache_usage_perc`` (0.9+)
or ``vllm:gpu_cache_usage_perc`` (older; both are fractions despite ``_perc``), the newer one
preferred when a page has both; prefix-cache counters are ``vllm:prefix_cache_*`` or, in 0.8.x,
``vllm:gpu_prefix_cache_*``. V1 pages label every series with ``engine`` (data-parallel index);
V0 pages do not, and count as engine ``"0"``. Per-engine values are kept, and the snapshot
aggregates them: KV usage is the *maximum* over engines (the most saturated engine decides
pressure), request counts and counters are sums. ``vllm:cache_config_info`` carries the engine's
cache settings as label strings; ``None``/``True``/``False`` strings are decoded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlencode

from sidecar.signals.kinds import EngineKind
from sidecar.signals.scan import Sample, scan

KV_USAGE: Final = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD: Final = "vllm:gpu_cache_usage_perc"
RUNNING: Final = "vllm:num_requests_running"
WAITING: Final = "vllm:num_requests_waiting"
WAITING_BY_REASON: Final = "vllm:num_requests_waiting_by_reason"
SWAPPED: Final = "vllm:num_requests_swapped"
PREEMPTIONS: Final = "vllm:num_preemptions_total"
PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
ITERATIONS: Final = "vllm:iteration_tokens_total_count"
"""Engine steps (the tokens-per-step histogram's count): a step gives a sequence at most one token, or one
more than the speculative tokens (:data:`SPEC_POSITIONS`) with speculative decoding."""
PREFIX_QUERIES: Final = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS: Final = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
CACHE_CONFIG: Final = "vllm:cache_config_info"
GENERATION_LENGTHS: Final = "vllm:request_generation_tokens_bucket"
"""The engine's histogram of finished requests' output lengths (all routes, since it started)."""
SPEC_POSITIONS: Final = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
"""Accepted draft tokens per draft position: one series per position (``position`` 0 to k - 1), created at
start-up when speculative decoding is configured (vLLM 0.32.0 as installed, ``SpecDecodingProm`` in
``vllm/v1/spec_decode/metrics.py``): its positions say ``num_speculative_tokens``, which nothing else
on the page says."""
LORA_INFO: Final = "vllm:lora_requests_info"
"""Present when vLLM serves with ``--enable-lora`` (0.32.0 as installed: ``PrometheusStatLogger`` creates it
only with a LoRA config, ``vllm/v1/metrics/loggers.py``); its ``max_lora`` label is ``--max-loras``, the
adapter slots the prediction budgets. Older releases showed it always, ``max_lora="0"`` when LoRA was off."""

WANTED: Final = (
    KV_USAGE,
    KV_USAGE_OLD,
    RUNNING,
    WAITING,
    WAITING_BY_REASON,
    SWAPPED,
    PREEMPTIONS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    ITERATIONS,
    *PREFIX_QUERIES,
    *PREFIX_HITS,
    CACHE_CONFIG,
    GENERATION_LENGTHS,
    SPEC_POSITIONS,
    LORA_INFO,
)
"""Every family the sidecar reads from a vLLM page."""

LIGHT: Final = (KV_USAGE, KV_USAGE_OLD, RUNNING, WAITING, PREEMPTIONS, ITERATIONS)
"""What admission reads at every decision: all a round asked for between full pages fetches.

vLLM serves ``/metrics/`` (with the slash) from ``prometheus_client``'s ASGI app (``make_asgi_app``, mounted
at ``/metrics`` by ``vllm/entrypoints/openai/api_server.py`` in 0.8.5 and 0.11.0 and by
``vllm/entrypoints/serve/instrumentator/metrics.py`` in 0.20.0 and 0.32.0, each read in its release's source;
plain ``/metrics`` is the instrumentator's handler in all four), which answers ``name[]=`` with those samples
alone (``prometheus_client/exposition.py``: ``restricted_registry``). Measured on vLLM 0.32 here
(``bench/page_cost.py``): 0.9 KB and ~0.6 ms of its API process against 54 KB and ~5 ms.
"""


def light_query() -> str:
    """The query string that asks a vLLM page for the :data:`LIGHT` samples alone."""
    return urlencode([("name[]", name) for name in LIGHT])


def _light_fields() -> tuple[str, ...]:
    """The :class:`EngineValues` fields the :data:`LIGHT` families fill (KV usage under either name)."""
    return ("kv_usage", *dict.fromkeys(_SCALAR_FIELDS[name] for name in LIGHT if name in _SCALAR_FIELDS))


def merge_light(full: EngineSnapshot, light: EngineSnapshot) -> EngineSnapshot | None:
    """``full`` with a light page's fresher :data:`LIGHT` values, or ``None`` if the light page falls short.

    Short: an engine or a value the full page has is missing (a registry that cannot filter: with several
    API servers vLLM collects through ``PROMETHEUS_MULTIPROC_DIR``, whose collector names no family, so a
    filtered page is empty), or it shows an engine the full page did not (read a full page).
    """
    if set(light.engines) != set(full.engines):
        return None
    engines = {}
    for name, values in full.engines.items():
        fresh = light.engines[name]
        changes = {key: getattr(fresh, key) for key in _light_fields()}
        if any(new is None and getattr(values, key) is not None for key, new in changes.items()):
            return None
        engines[name] = dataclasses.replace(values, **changes)
    return dataclasses.replace(full, engines=engines)


def label_int(value: str | float | None) -> int | None:
    """An integer from a label string or a sample value; ``None`` for none, "None", junk, NaN or infinity."""
    number = _label_float(value)
    return None if number is None else int(number)


def _label_float(value: str | float | None) -> float | None:
    if value is None or value in {"", "None"}:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _label_bool(value: str | None) -> bool | None:
    return {"True": True, "true": True, "False": False, "false": False}.get(value or "")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The engine's KV-cache settings from ``vllm:cache_config_info``."""

    block_size: int | None
    num_gpu_blocks: int | None
    cache_dtype: str | None
    gpu_memory_utilization: float | None
    enable_prefix_caching: bool | None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    mamba_ssm_cache_dtype: str | None = None  # the state layers' SSM dtype as the engine settled it
    mamba_cache_dtype: str | None = None  # their conv state's dtype (--mamba-cache-dtype)

    @property
    def pool_tokens(self) -> int | None:
        """The KV pool in tokens: ``kv_cache_size_tokens``, else ``num_gpu_blocks x block_size``."""
        if self.kv_cache_size_tokens is not None:
            return self.kv_cache_size_tokens
        if self.num_gpu_blocks is not None and self.block_size is not None:
            return self.num_gpu_blocks * self.block_size
        return None

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> CacheConfig:
        """Decode the label strings of one ``cache_config_info`` sample."""
        return cls(
            block_size=label_int(labels.get("block_size")),
            num_gpu_blocks=label_int(labels.get("num_gpu_blocks")),
            cache_dtype=labels.get("cache_dtype") or None,
            gpu_memory_utilization=_label_float(labels.get("gpu_memory_utilization")),
            enable_prefix_caching=_label_bool(labels.get("enable_prefix_caching")),
            kv_cache_size_tokens=label_int(labels.get("kv_cache_size_tokens")),
            kv_cache_max_concurrency=_label_float(labels.get("kv_cache_max_concurrency")),
            kv_cache_memory_bytes=label_int(labels.get("kv_cache_memory_bytes")),
            num_gpu_blocks_override=label_int(labels.get("num_gpu_blocks_override")),
            mamba_ssm_cache_dtype=labels.get("mamba_ssm_cache_dtype") or None,
            mamba_cache_dtype=labels.get("mamba_cache_dtype") or None,
        )


@dataclass(frozen=True, slots=True)
class EngineValues:
    """The values of one data-parallel engine (``None`` where its page lacks the family)."""

    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    swapped: float | None = None
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    iterations_total: float | None = None
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    generation_lengths: dict[float, float] = field(default_factory=dict)  # bucket upper bound -> cumulative


class _Summed:
    """A read-only attribute: one :class:`EngineValues` field summed over engines (``None`` if absent)."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self._field = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._field = name

    def __get__(self, snapshot: EngineSnapshot | None, owner: type | None = None) -> float | None:
        if snapshot is None:
            return None
        present = [v for e in snapshot.engines.values() if (v := getattr(e, self._field)) is not None]
        return math.fsum(present) if present else None


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """What one scrape of vLLM's ``/metrics`` said, per engine and aggregated."""

    engines: dict[str, EngineValues]
    model_name: str | None
    cache_config: CacheConfig | None
    kv_usage_metric: str | None  # which name the KV usage came from; None when the page had neither
    kind: EngineKind = EngineKind.VLLM  # whose page it was
    speculative_tokens: int = 0  # draft tokens per step and sequence (:data:`SPEC_POSITIONS`); 0: none
    max_loras: int | None = None  # vLLM --max-loras (``vllm:lora_requests_info``); None: no LoRA on the page

    @property
    def kv_usage(self) -> float | None:
        """KV-cache usage in [0, 1]: the most saturated engine's."""
        values = [
            e.kv_usage for e in self.engines.values() if e.kv_usage is not None and not math.isnan(e.kv_usage)
        ]
        return max(values) if values else None

    running = _Summed("Requests running, summed over engines.")
    waiting = _Summed("Requests waiting, summed over engines.")
    swapped = _Summed("Requests swapped to CPU (V0 engines only), summed.")
    preemptions_total = _Summed("Preemptions since the engine started, summed.")
    prompt_tokens_total = _Summed("Prompt tokens processed, summed.")
    generation_tokens_total = _Summed("Tokens generated, summed.")
    iterations_total = _Summed("Engine steps since start, summed (an upper bound on any request's progress).")
    prefix_cache_queries_total = _Summed("Prefix-cache lookups (tokens), summed.")
    prefix_cache_hits_total = _Summed("Prefix-cache hits (tokens), summed.")

    @property
    def generation_lengths(self) -> tuple[tuple[float, float], ...]:
        """The engine's output-length histogram: ``(upper bound, cumulative count)``, summed, ascending."""
        totals: dict[float, float] = {}
        for engine in self.engines.values():
            for bound, count in engine.generation_lengths.items():
                totals[bound] = totals.get(bound, 0.0) + count
        return tuple(sorted(totals.items()))

    @property
    def waiting_by_reason(self) -> dict[str, float]:
        """Waiting requests by reason (``capacity``, ``deferred``), summed."""
        totals: dict[str, float] = {}
        for engine in self.engines.values():
            for reason, value in engine.waiting_by_reason.items():
                totals[reason] = totals.get(reason, 0.0) + value
        return totals


_SCALAR_FIELDS: Final = {
    RUNNING: "running",
    WAITING: "waiting",
    SWAPPED: "swapped",
    PREEMPTIONS: "preemptions_total",
    PROMPT_TOKENS: "prompt_tokens_total",
    GENERATION_TOKENS: "generation_tokens_total",
    ITERATIONS: "iterations_total",
    PREFIX_QUERIES[0]: "prefix_cache_queries_total",
    PREFIX_QUERIES[1]: "prefix_cache_queries_total",
    PREFIX_HITS[0]: "prefix_cache_hits_total",
    PREFIX_HITS[1]: "prefix_cache_hits_total",
}


def snapshot_from_samples(samples: Iterable[Sample]) -> EngineSnapshot:
    """Build the snapshot from scanned samples (see :func:`parse_vllm_metrics`)."""
    per_engine: dict[str, dict[str, object]] = {}
    model_name: str | None = None
    cache_config: CacheConfig | None = None
    usage_new: dict[str, float] = {}
    usage_old: dict[str, float] = {}
    positions: set[int] = set()
    max_loras: int | None = None
    for sample in samples:
        engine = sample.label("engine", "0")
        model_name = model_name or sample.label("model_name") or None
        values = per_engine.setdefault(engine, {"waiting_by_reason": {}, "generation_lengths": {}})
        if sample.name == CACHE_CONFIG:
            if cache_config is None:
                cache_config = CacheConfig.from_labels(dict(sample.labels))
        elif sample.name in {KV_USAGE, KV_USAGE_OLD}:
            (usage_new if sample.name == KV_USAGE else usage_old)[engine] = sample.value
        elif sample.name == GENERATION_LENGTHS:
            lengths = values["generation_lengths"]
            assert isinstance(lengths, dict)  # noqa: S101 - set just above
            with contextlib.suppress(ValueError):  # "+Inf" reads as inf: the total
                bound = float(sample.label("le", "nan"))
                if not math.isnan(bound):
                    lengths[bound] = lengths.get(bound, 0.0) + sample.value  # one series per model name
        elif sample.name == SPEC_POSITIONS:
            positions.add(label_int(sample.label("position")) or 0)
        elif sample.name == LORA_INFO:
            max_loras = max(max_loras or 0, label_int(sample.label("max_lora")) or 0)
        elif sample.name == WAITING_BY_REASON:
            reasons = values["waiting_by_reason"]
            assert isinstance(reasons, dict)  # noqa: S101 - set just above
            reasons[sample.label("reason", "unknown")] = sample.value
        elif sample.name in _SCALAR_FIELDS:
            key = _SCALAR_FIELDS[sample.name]
            if key not in values or sample.name in {PREFIX_QUERIES[0], PREFIX_HITS[0]}:
                values[key] = sample.value
    usage = usage_new or usage_old
    for engine, value in usage.items():
        per_engine.setdefault(engine, {"waiting_by_reason": {}, "generation_lengths": {}})["kv_usage"] = value
    engines = {name: EngineValues(**vals) for name, vals in sorted(per_engine.items())}  # type: ignore[arg-type]
    metric = KV_USAGE if usage_new else (KV_USAGE_OLD if usage_old else None)
    return EngineSnapshot(
        engines=engines,
        model_name=model_name,
        cache_config=cache_config,
        kv_usage_metric=metric,
        speculative_tokens=max(positions) + 1 if positions else 0,
        max_loras=max_loras,
    )


def parse_vllm_metrics(text: str) -> EngineSnapshot:
    """Scan a vLLM ``/metrics`` page into an :class:`EngineSnapshot` (raises ``MetricsParseError``)."""
    return snapshot_from_samples(scan(text, WANTED))
