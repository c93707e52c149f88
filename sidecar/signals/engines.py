"""Every engine of the gateway's model-server protocol, mapped to one :class:`EngineSnapshot`.

Theory of operation
-------------------
The Gateway API Inference Extension's *model server protocol*
(``docs/proposals/003-model-server-protocol`` in kubernetes-sigs/gateway-api-inference-extension,
unchanged from v1.3 to v1.6) fixes what a model server must report, with each engine's names:

* queued requests: ``sglang:num_queue_reqs``; ``trtllm_num_requests_waiting`` (trtllm-serve);
  ``nv_trt_llm_request_metrics{request_type="waiting"}`` (Triton's TensorRT-LLM backend);
* running requests: ``sglang:num_running_reqs``; ``trtllm_num_requests_running``;
  ``nv_trt_llm_request_metrics{request_type="scheduled"}``;
* KV utilisation, a fraction in [0, 1]: ``sglang:token_usage``; ``trtllm_kv_cache_utilization``;
  ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}``;
* the pool (optional): block size and block count as labels ``page_size`` / ``num_pages`` of
  ``sglang:cache_config_info``; ``trtllm_kv_cache_tokens_per_block`` / ``trtllm_kv_cache_max_blocks``;
  ``kv_cache_block_type="tokens_per"`` / ``"max"`` of Triton's block family.

vLLM's page is richer (engine steps, prefix-cache counters, the output-length histogram) and keeps
its own parser (:mod:`sidecar.signals.vllm`); the others are read by one table-driven parser into
the same snapshot, ``None`` wherever an engine reports nothing. Which engine wrote a page is
decided by the page itself (:func:`detect`: the first family prefix only that engine uses) unless
``--engine`` names it. Data-parallel ranks are SGLang's ``dp_rank`` label (vLLM's ``engine``); KV
usage is the most saturated rank's, counts are summed, as for vLLM. What an engine does not report
degrades admission to the policy that needs less (capacity needs a pool in blocks; lanes needs
nothing), and ``/status`` says which.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from sidecar.signals.kinds import EngineKind
from sidecar.signals.scan import Sample, scan
from sidecar.signals.vllm import CacheConfig, EngineSnapshot, EngineValues, label_int, parse_vllm_metrics


@dataclass(frozen=True, slots=True)
class Series:
    """One metric name, optionally narrowed to the samples whose ``label`` has a given value."""

    name: str
    label: tuple[str, str] | None = None

    def matches(self, sample: Sample) -> bool:
        """Whether ``sample`` is this series."""
        if sample.name != self.name:
            return False
        return self.label is None or sample.label(self.label[0]) == self.label[1]


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one engine names the figures the sidecar reads."""

    kind: EngineKind
    marker: str  # a family-name prefix only this engine's pages carry
    kv_usage: Series
    running: Series
    waiting: Series
    rank_label: str | None = None  # the label naming a data-parallel rank
    breakdown_label: str | None = None  # series with a non-empty value of it repeat the totals by category
    metrics_path: str = "/metrics"
    model_label: str = "model_name"
    block_size: Series | None = None
    num_blocks: Series | None = None
    cache_info: tuple[str, str, str] | None = None  # info family, block-size label, block-count label
    pool_tokens: Series | None = None  # the pool in tokens, when the engine gives no block figures
    preemptions: Series | None = None  # a counter of requests preempted (SGLang: retracted)
    prompt_tokens: Series | None = None
    generation_tokens: Series | None = None

    def fields(self) -> dict[str, Series]:
        """The per-rank figures by :class:`EngineValues` field."""
        named = {
            "kv_usage": self.kv_usage,
            "running": self.running,
            "waiting": self.waiting,
            "preemptions_total": self.preemptions,
            "prompt_tokens_total": self.prompt_tokens,
            "generation_tokens_total": self.generation_tokens,
        }
        return {key: series for key, series in named.items() if series is not None}

    def wanted(self) -> tuple[str, ...]:
        """Every family name to scan for."""
        names = {series.name for series in self.fields().values()}
        names |= {s.name for s in (self.block_size, self.num_blocks, self.pool_tokens) if s is not None}
        if self.cache_info is not None:
            names.add(self.cache_info[0])
        return tuple(sorted(names))


_TRT_BLOCKS: Final = "nv_trt_llm_kv_cache_block_metrics"
_TRT_REQUESTS: Final = "nv_trt_llm_request_metrics"

DIALECTS: Final = (
    Dialect(
        kind=EngineKind.SGLANG,
        marker="sglang:",
        kv_usage=Series("sglang:token_usage"),
        running=Series("sglang:num_running_reqs"),
        waiting=Series("sglang:num_queue_reqs"),
        rank_label="dp_rank",
        breakdown_label="priority",  # priority scheduling: totals carry priority="", then one per level
        block_size=Series("sglang:page_size"),  # 0.5.11+
        num_blocks=Series("sglang:num_pages"),  # 0.5.11+
        cache_info=("sglang:cache_config_info", "page_size", "num_pages"),  # 0.5.9-0.5.10
        pool_tokens=Series("sglang:max_total_num_tokens"),  # 0.5.6+
        preemptions=Series("sglang:num_retracted_requests_total"),  # 0.5.7+
        prompt_tokens=Series("sglang:prompt_tokens_total"),
        generation_tokens=Series("sglang:generation_tokens_total"),
    ),
    Dialect(
        kind=EngineKind.TRTLLM_SERVE,
        marker="trtllm_",
        metrics_path="/prometheus/metrics",  # its /metrics is JSON; this page needs return_perf_metrics: true
        kv_usage=Series("trtllm_kv_cache_utilization"),
        running=Series("trtllm_num_requests_running"),
        waiting=Series("trtllm_num_requests_waiting"),
        block_size=Series("trtllm_kv_cache_tokens_per_block"),
        num_blocks=Series("trtllm_kv_cache_max_blocks"),
    ),
    Dialect(
        kind=EngineKind.TRITON_TENSORRT_LLM,
        marker="nv_trt_llm_",
        kv_usage=Series(_TRT_BLOCKS, ("kv_cache_block_type", "fraction")),
        running=Series(_TRT_REQUESTS, ("request_type", "scheduled")),
        waiting=Series(_TRT_REQUESTS, ("request_type", "waiting")),
        model_label="model",
        block_size=Series(_TRT_BLOCKS, ("kv_cache_block_type", "tokens_per")),
        num_blocks=Series(_TRT_BLOCKS, ("kv_cache_block_type", "max")),
    ),
)
"""The engines other than vLLM, in the order :func:`detect` tries them."""

BY_KIND: Final = {dialect.kind: dialect for dialect in DIALECTS}


def _has_family(text: str, prefix: str) -> bool:
    return text.startswith(prefix) or f"\n{prefix}" in text


def detect(text: str) -> EngineKind | None:
    """The engine whose families the page carries (vLLM first), or ``None`` for none of them."""
    if _has_family(text, "vllm:"):
        return EngineKind.VLLM
    for dialect in DIALECTS:
        if _has_family(text, dialect.marker):
            return dialect.kind
    return None


def _cache_config(dialect: Dialect, samples: Iterable[Sample]) -> CacheConfig | None:
    block_size: int | None = None
    num_blocks: int | None = None
    pool_tokens: int | None = None
    for sample in samples:
        if dialect.pool_tokens is not None and dialect.pool_tokens.matches(sample):
            pool_tokens = (pool_tokens or 0) + (label_int(sample.value) or 0)
            continue
        if dialect.cache_info is not None and sample.name == dialect.cache_info[0]:
            block_size = block_size or label_int(sample.label(dialect.cache_info[1]) or None)
            num_blocks = num_blocks or label_int(sample.label(dialect.cache_info[2]) or None)
        elif dialect.block_size is not None and dialect.block_size.matches(sample):
            block_size = block_size or label_int(sample.value)
        elif dialect.num_blocks is not None and dialect.num_blocks.matches(sample):
            num_blocks = (num_blocks or 0) + (label_int(sample.value) or 0)  # summed over ranks
    if num_blocks is None and pool_tokens is not None:  # SGLang 0.5.6-0.5.8: tokens, in pages of one
        block_size, num_blocks = block_size or 1, pool_tokens // (block_size or 1)
    if block_size is None and num_blocks is None:
        return None
    return CacheConfig(
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        cache_dtype=None,
        gpu_memory_utilization=None,
        enable_prefix_caching=None,
    )


def snapshot_of(dialect: Dialect, samples: list[Sample]) -> EngineSnapshot:
    """The snapshot of one engine's scanned samples."""
    fields = dialect.fields()
    ranks: dict[str, dict[str, float]] = {}
    model_name: str | None = None
    for sample in samples:
        if dialect.breakdown_label and sample.label(dialect.breakdown_label):
            continue
        for key, series in fields.items():
            if series.matches(sample):
                rank = sample.label(dialect.rank_label, "0") if dialect.rank_label else "0"
                values = ranks.setdefault(rank, {})
                if key == "kv_usage":  # a fraction: the fullest of several series, never their sum
                    values[key] = max(values.get(key, 0.0), sample.value)
                else:
                    values[key] = values.get(key, 0.0) + sample.value  # one series per model name
                model_name = model_name or sample.label(dialect.model_label) or None
    engines = {rank: EngineValues(**values) for rank, values in sorted(ranks.items())}  # type: ignore[arg-type]
    has_usage = any(values.kv_usage is not None for values in engines.values())
    return EngineSnapshot(
        engines=engines,
        model_name=model_name,
        cache_config=_cache_config(dialect, samples),
        kv_usage_metric=dialect.kv_usage.name if has_usage else None,
        kind=dialect.kind,
    )


def parse_engine_metrics(text: str, kind: EngineKind | None = None) -> EngineSnapshot:
    """Scan an engine's ``/metrics`` page (``kind=None``: whichever engine wrote it; vLLM if none)."""
    kind = kind or detect(text) or EngineKind.VLLM
    if kind is EngineKind.VLLM:
        return parse_vllm_metrics(text)
    dialect = BY_KIND[kind]
    return snapshot_of(dialect, scan(text, dialect.wanted()))
