"""Generate the Grafana dashboards from code (grafana-foundation-sdk, pinned).

Run: ``.venv/bin/python -m dashboards.generate`` writes ``dashboards/*.json``; ``--check`` fails when the
committed JSON differs from what the code generates (the tests run it). Queries use only the sidecar's
documented metrics and current vLLM names (``vllm:kv_cache_usage_perc``, ``vllm:num_preemptions_total``,
``vllm:time_to_first_token_seconds``), filtered by the ``namespace``, ``pod`` and ``model`` variables.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.builders.common import GraphThresholdsStyleConfig, VizLegendOptions
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    DataSourceRef,
    GraphThresholdsStyleMode,
    LegendDisplayMode,
    LegendPlacement,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

HERE = Path(__file__).parent
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'namespace=~"$namespace", pod=~"$pod"'
VLLM = SEL + ', model_name=~"$model"'
RATE = "$__rate_interval"


def query(expr: str, legend: str) -> prometheus.Dataquery:
    """One PromQL target."""
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def panel(
    title: str, unit: str, description: str, *targets: prometheus.Dataquery, width: int = 12
) -> timeseries.Panel:
    """A time series panel with our defaults: unit set, legend visible, datasource from the variable."""
    built = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(8)
        .span(width)
        .legend(
            VizLegendOptions()
            .show_legend(True)
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
        )
    )
    for ref_id, target in zip("ABCDEFGH", targets, strict=False):
        built = built.with_target(target.ref_id(ref_id))
    return built


def threshold_line(built: timeseries.Panel, value: float) -> timeseries.Panel:
    """Draw a dashed red line at ``value``."""
    steps = [Threshold(value=None, color="green"), Threshold(value=value, color="red")]
    return built.thresholds(
        dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)
    ).thresholds_style(GraphThresholdsStyleConfig().mode(GraphThresholdsStyleMode.DASHED))


def variables(builder: dashboard.Dashboard) -> dashboard.Dashboard:
    """Datasource, namespace, pod and model variables."""
    everything = VariableOption(selected=True, text="All", value="$__all")

    def label_values(name: str, label: str, source: str) -> dashboard.QueryVariable:
        return (
            dashboard.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            .query(source)
            .definition(source)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(everything)
        )

    return (
        builder.with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(
            label_values("namespace", "Namespace", "label_values(kv_sidecar_build_info, namespace)")
        )
        .with_variable(
            label_values("pod", "Pod", 'label_values(kv_sidecar_build_info{namespace=~"$namespace"}, pod)')
        )
        .with_variable(
            label_values("model", "Model", f"label_values(vllm:num_requests_running{{{SEL}}}, model_name)")
        )
    )


def base(title: str, uid: str, description: str) -> dashboard.Dashboard:
    """Dashboard settings shared by both dashboards."""
    return variables(
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["kv-sidecar", "vllm"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
    )


def kv_pressure() -> dashboard.Dashboard:
    """KV usage, pressure, engine queues, preemptions, admission and latency."""
    usage = (
        panel(
            "KV cache usage",
            "percentunit",
            "Engine KV-cache usage (most saturated data-parallel engine) as the sidecar reads it, and vLLM's own "
            "gauge. The dashed line is the pressure threshold (0.85).",
            query(f"max by (pod) (kv_sidecar_engine_kv_cache_usage_ratio{{{SEL}}})", "{{pod}} (sidecar)"),
            query(f"max by (pod) (vllm:kv_cache_usage_perc{{{VLLM}}})", "{{pod}} (vLLM)"),
        )
        .min(0)
        .max(1)
    )
    return (
        base(
            "kv-sidecar / KV pressure",
            "kv-sidecar-kv-pressure",
            "KV-cache pressure and what admission does about it.",
        )
        .with_row(dashboard.Row("KV cache"))
        .with_panel(threshold_line(usage, 0.85))
        .with_panel(
            panel(
                "Pressure state",
                "none",
                "1 while the sidecar acts under KV pressure (long prompts queued or refused).",
                query(f"max by (pod) (kv_sidecar_pressure_state{{{SEL}}})", "{{pod}}"),
            )
            .min(0)
            .max(1)
        )
        .with_panel(
            panel(
                "Requests in the engine",
                "short",
                "Running and waiting requests in vLLM.",
                query(f"sum by (pod, state) (kv_sidecar_engine_requests{{{SEL}}})", "{{pod}} {{state}}"),
            )
        )
        .with_panel(
            panel(
                "Preemptions",
                "ops",
                "Preemptions per second: the KV cache ran out mid-generation.",
                query(
                    f"sum by (pod) (rate(kv_sidecar_engine_preemptions_total{{{SEL}}}[{RATE}]))",
                    "{{pod}} (sidecar)",
                ),
                query(f"sum by (pod) (rate(vllm:num_preemptions_total{{{VLLM}}}[{RATE}]))", "{{pod}} (vLLM)"),
            )
        )
        .with_row(dashboard.Row("Admission"))
        .with_panel(
            panel(
                "Admission outcomes by reason",
                "reqps",
                "Generation requests per second by outcome and reason (admitted, queued, kv-pressure, queue-full, ...).",
                query(
                    f"sum by (outcome, reason) (rate(kv_sidecar_admission_total{{{SEL}}}[{RATE}]))",
                    "{{outcome}} {{reason}}",
                ),
            )
        )
        .with_panel(
            panel(
                "Queue depth",
                "short",
                "Requests waiting in the admission queue, by lane.",
                query(f"sum by (lane) (kv_sidecar_queue_depth{{{SEL}}})", "{{lane}}"),
            )
        )
        .with_panel(
            panel(
                "What an inference gateway sees",
                "short",
                "The series the sidecar serves on the traffic port for an endpoint picker: queued (the engine's "
                "waiting plus the sidecar's queue) and running requests, per pod.",
                query(f"sum by (pod) (kv_sidecar_gateway_queued_requests{{{SEL}}})", "{{pod}} queued"),
                query(f"sum by (pod) (kv_sidecar_gateway_running_requests{{{SEL}}})", "{{pod}} running"),
            )
        )
        .with_panel(
            panel(
                "Queue wait p95",
                "s",
                "95th percentile of the time requests spent queued, by lane.",
                query(
                    f"histogram_quantile(0.95, sum by (le, lane) (rate(kv_sidecar_queue_wait_seconds_bucket{{{SEL}}}[{RATE}])))",
                    "{{lane}}",
                ),
            )
        )
        .with_panel(
            panel(
                "In-flight requests",
                "short",
                "Admitted generation requests whose responses have not ended, by lane.",
                query(f"sum by (lane) (kv_sidecar_inflight_requests{{{SEL}}})", "{{lane}}"),
            )
        )
        .with_row(dashboard.Row("Latency"))
        .with_panel(
            panel(
                "Time to first token p95",
                "s",
                "Through the sidecar: request received to the first byte of the engine's answer. In vLLM: its own "
                "time to first token.",
                query(
                    f"histogram_quantile(0.95, sum by (le, lane) (rate(kv_sidecar_time_to_first_byte_seconds_bucket{{{SEL}}}[{RATE}])))",
                    "sidecar {{lane}}",
                ),
                query(
                    f"histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{{{VLLM}}}[{RATE}])))",
                    "vLLM",
                ),
            )
        )
        .with_panel(
            panel(
                "Request duration p95",
                "s",
                "Request received to response ended, through the sidecar, by lane.",
                query(
                    f"histogram_quantile(0.95, sum by (le, lane) (rate(kv_sidecar_request_duration_seconds_bucket{{{SEL}}}[{RATE}])))",
                    "{{lane}}",
                ),
            )
        )
    )


def memory_budget() -> dashboard.Dashboard:
    """The predicted ledger against the GPU, the pool, concurrency and NVML memory."""
    return (
        base(
            "kv-sidecar / Memory budget",
            "kv-sidecar-memory-budget",
            "What the arithmetic predicts for this deployment, next to what vLLM and the GPU report.",
        )
        .with_row(dashboard.Row("Prediction"))
        .with_panel(
            panel(
                "Predicted ledger per GPU",
                "bytes",
                "Weights, KV cache (target concurrency at full length), activation and overhead, against GPU memory.",
                query(
                    f'max by (component) (kv_sidecar_budget_bytes{{{SEL}, component=~"weights|kv_cache|activation|overhead"}})',
                    "{{component}}",
                ),
                query(f'max(kv_sidecar_budget_bytes{{{SEL}, component="gpu_memory"}})', "GPU memory"),
                query(f'max(kv_sidecar_budget_bytes{{{SEL}, component="total"}})', "total"),
            ).min(0)
        )
        .with_panel(
            panel(
                "KV pool: predicted vs engine",
                "short",
                "KV pool in tokens as predicted and as vLLM reports it (cache_config_info).",
                query(f"max by (source) (kv_sidecar_kv_pool_tokens{{{SEL}}})", "{{source}}"),
            ).min(0)
        )
        .with_panel(
            threshold_line(
                panel(
                    "KV pool drift",
                    "percentunit",
                    "(engine - predicted) / predicted pool tokens; the alert fires beyond 20% either way.",
                    query(f"max by (pod) (kv_sidecar_kv_pool_drift_ratio{{{SEL}}})", "{{pod}}"),
                ),
                0.2,
            )
        )
        .with_panel(
            panel(
                "Maximum concurrency vs target",
                "short",
                "Full-length requests the pool holds (predicted, engine) and the target concurrency.",
                query(f"max by (source) (kv_sidecar_max_concurrency{{{SEL}}})", "{{source}}"),
            ).min(0)
        )
        .with_row(dashboard.Row("GPU"))
        .with_panel(
            panel(
                "GPU memory (NVML)",
                "bytes",
                "Used, reserved and total memory per GPU.",
                query(
                    f'max by (gpu, kind) (kv_sidecar_gpu_memory_bytes{{{SEL}, kind=~"used|reserved|total"}})',
                    "GPU {{gpu}} {{kind}}",
                ),
            ).min(0)
        )
        .with_panel(
            panel(
                "Peak vs steady GPU memory",
                "bytes",
                "Peak used memory since the sidecar started and the median over the last hour: their gap is the "
                "real safety margin.",
                query(
                    f'max by (gpu) (kv_sidecar_gpu_memory_bytes{{{SEL}, kind="peak"}})', "GPU {{gpu}} peak"
                ),
                query(
                    f'max by (gpu) (quantile_over_time(0.5, kv_sidecar_gpu_memory_bytes{{{SEL}, kind="used"}}[1h]))',
                    "GPU {{gpu}} steady (median, 1h)",
                ),
            ).min(0)
        )
        .with_panel(
            panel(
                "Diagnoses holding",
                "short",
                "Diagnoses the monitor reports now, by severity (kv-sidecar check lists them).",
                query(f"sum by (severity) (kv_sidecar_diagnoses{{{SEL}}})", "{{severity}}"),
            ).min(0)
        )
    )


DASHBOARDS: dict[str, Callable[[], dashboard.Dashboard]] = {
    "kv-pressure.json": kv_pressure,
    "memory-budget.json": memory_budget,
}


def render(factory: Callable[[], dashboard.Dashboard]) -> str:
    """The dashboard's JSON text, stable across runs."""
    return JSONEncoder(sort_keys=True, indent=2).encode(factory().build()) + "\n"


def expressions(document: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard document (panels' targets)."""
    found = []
    for item in document.get("panels", []):
        for target in item.get("targets", []) or []:
            if target.get("expr"):
                found.append(target["expr"])
    return found


def main() -> int:
    """Write (or with ``--check``, compare) every dashboard's JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="fail when the committed JSON is not what the code generates"
    )
    args = parser.parse_args()
    stale = []
    for name, factory in DASHBOARDS.items():
        path = HERE / name
        text = render(factory)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"written {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run: python -m dashboards.generate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
