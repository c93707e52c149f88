"""The admission suite's figures across rounds: medians, paired ratios and the printed tables. Pure."""

from __future__ import annotations

import statistics
from typing import Any

from tests.harness.spike import _fmt


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each metric's median over rounds (lists: the union; flags: all)."""
    out: dict[str, Any] = {}
    skip = {"clients", "round", "token_seed", "sidecar_admission_at_start", "sidecar_log"}
    for key in (k for k in runs[0] if k not in skip):
        values = [r[key] for r in runs if r[key] is not None]
        if key in {"errors", "retry_after"}:
            out[key] = sorted({v for vs in values for v in vs})
        elif key == "answer_tokens":
            middle = [statistics.median(v[i] for v in values) for i in range(3)] if values else None
            out[key] = [int(m) if float(m).is_integer() else m for m in middle] if middle else None
        elif key == "all_refusals_retry_after":
            out[key] = all(values) if values else None
        else:
            out[key] = statistics.median(values) if values else None
    return out


def paired_ratios(runs: dict[str, list[dict[str, Any]]], key: str) -> list[float]:
    """Sidecar over straight for ``key``, round by round (the two runs of a round are back to back).

    This VM's speed drifts by up to 2x between minutes; a round's two runs share the drift, so the
    median of the per-round ratios is the steadier comparison (the medians of each column are reported too).
    """
    return [
        s[key] / d[key]
        for d, s in zip(runs["direct"], runs["sidecar"], strict=True)
        if d[key] and s[key] is not None
    ]


ROWS = [
    ("requests sent", "sent", "{:.0f}"), ("completed", "completed", "{:.0f}"), ("refused", "refused", "{:.0f}"),
    ("  Retry-After values (s)", "retry_after", "{}"), ("  Retry-After median (s)", "retry_after_median", "{:.0f}"),
    ("  every 429/503 had one", "all_refusals_retry_after", "{}"), ("lost", "lost", "{:.0f}"),
    ("vLLM preemptions", "preemptions", "{:.0f}"), ("peak KV usage", "peak_kv_usage", "{:.0%}"),
    ("short p95 (s; all if no short)", "short_p95", "{:.2f}"), ("long/mid p50 (s)", "long_p50", "{:.2f}"),
    ("makespan (s)", "makespan", "{:.1f}"), ("  with the retries (s)", "makespan_with_retries", "{:.1f}"),
    ("answer tokens p10,p50,p90", "answer_tokens", "{}"),
    ("streamed", "streamed", "{:.0f}"), ("max sidecar queue depth", "max_queue_depth", "{:.0f}"),
    ("retried after Retry-After", "retried", "{:.0f}"), ("  share admitted", "retry_admitted_share", "{:.0%}"),
    ("admitted max latency (s)", "admitted_max_latency", "{:.1f}"),
    ("proxy CPU during the run (s)", "proxy_cpu_seconds", "{:.2f}"),
]  # fmt: skip


def print_shape(name: str, columns: dict[str, dict[str, Any]]) -> None:
    """One shape's side-by-side table (rows: metrics; columns: direct, sidecar)."""
    print(f"\n{name:<32}" + "".join(f"{t:>16}" for t in columns))
    for title, key, pattern in ROWS:
        cells = [
            str(value).lower() if isinstance(value := col.get(key), bool) else _fmt(value, pattern)
            for col in columns.values()
        ]
        print(f"{title:<32}" + "".join(f"{c:>16}" for c in cells))
    errors = sorted({e for col in columns.values() for e in col["errors"]})
    if errors:
        print("  errors: " + "; ".join(errors))


def print_summary(result: dict[str, Any]) -> None:
    """A row per shape: direct -> sidecar."""

    def arrow(d: Any, s: Any, pattern: str) -> str:
        return f"{_fmt(d, pattern)}->{_fmt(s, pattern)}"

    def ratio(d: float | None, s: float | None) -> str:
        return f"{s / d:.2f}x" if d and s is not None else "-"

    def paired(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}x" if values else "-"

    print(f"\n{'shape':<22}{'preempt d->s':>14}{'short p95 d->s':>16}{'ratio':>8}{'paired':>8}{'makespan s/d':>14}"
          f"{'paired':>8}{'lost d/s':>10}{'refused (R-A)':>16}")  # fmt: skip
    for name, entry in result["shapes"].items():
        d, s = entry["median"]["direct"], entry["median"]["sidecar"]
        retry_after = {True: "yes", False: "no", None: "-"}[s["all_refusals_retry_after"]]
        print(
            f"{name:<22}{arrow(d['preemptions'], s['preemptions'], '{:.0f}'):>14}"
            f"{arrow(d['short_p95'], s['short_p95'], '{:.2f}'):>16}{ratio(d['short_p95'], s['short_p95']):>8}"
            f"{paired(entry['paired']['short_p95']):>8}{ratio(d['makespan'], s['makespan']):>14}"
            f"{paired(entry['paired']['makespan']):>8}{_fmt(d['lost'], '{:.0f}') + '/' + _fmt(s['lost'], '{:.0f}'):>10}"
            f"{_fmt(s['refused'], '{:.0f}') + f' ({retry_after})':>16}"
        )
    if not result["prefix_cache_reset"]:
        print("(vLLM did not answer 200 to POST /reset_prefix_cache: fresh prompts alone kept runs apart)")
