"""The Helm chart, linted and rendered offline (helm-python-sdk), validated, and checked against the project."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from sidecar.admission.decide import AdmissionMode, OnPressure
from sidecar.admission.pressure import StaleMode
from sidecar.budget.kv_formats import KV_FORMATS
from sidecar.budget.lora import LORA_RANKS, LoraSlots
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.cli import build_parser, plan_inputs_from_args
from sidecar.deployment_flags import VLLM_VARIABLES, kv_dtype, lora_slots_from_args
from sidecar.server import gateway
from sidecar.units import GIB

ROOT = Path(__file__).parents[2]
CHART = ROOT / "helm" / "kv-sidecar"
CRDS = ROOT / "tests" / "data" / "crds"  # copies of the team's shared/crds (provenance in their README)
K8S_VERSION = "1.30"
pytestmark = pytest.mark.system

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "monitoring": {
        "sidecar": {"adminToken": {"secretName": "kv-admin"}},
        "monitoring": {
            "podMonitor": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
            "serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
            "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kube-prometheus-stack"}},
            "dashboards": {"enabled": True, "annotations": {"grafana_folder": "LLM serving"}},
        }
    },
    "autoscaling": {"autoscaling": {"keda": {"enabled": True, "maxReplicas": 6}}},
    "gateway": {"gateway": {"inferencePool": {"enabled": True}, "eppConfig": {"enabled": True}},
                "replicaCount": 3},
    "tensor-parallel-2": {"model": {"name": "meta-llama/Llama-3.1-70B-Instruct"}, "vllm": {"tensorParallelSize": 2},
                          "sidecar": {"gpu": "h100", "concurrency": 4}},
    "pipeline-parallel-2": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                            "vllm": {"tensorParallelSize": 2, "pipelineParallelSize": 2}, "sidecar": {"gpu": "h100"}},
    "moe-data-parallel": {"model": {"name": "Qwen/Qwen3-30B-A3B"},
                          "vllm": {"dataParallelSize": 2, "enableExpertParallel": True}, "sidecar": {"gpu": "h100"}},
    "lora": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "sidecar": {"gpu": "l4"},
             "vllm": {"lora": {"enabled": True, "maxLoras": 4, "maxLoraRank": 64, "fullySharded": True,
                               "targetModules": ["q_proj", "o_proj"]},
                      "cpuOffloadGb": 2.5, "speculativeConfig": {"method": "ngram", "num_speculative_tokens": 3,
                                                               "prompt_lookup_max": 4}}},
    "fp8-kv": {"vllm": {"kvCacheDtype": "fp8", "quantization": "awq", "maxNumBatchedTokens": 8192, "blockSize": 32,
                        "streamInterval": 4,
                        "enablePrefixCaching": True,
                        "extraArgs": ["--enable-chunked-prefill", "--exclude-tools-when-tool-choice-none",
                                      "--tokenizer-mode", "mistral", "--tokenizer", "acme/tiny-tokenizer",
                                      "--tokenizer-revision", "v2"]},
               "sidecar": {"gpuMemory": "24GiB", "nvml": {"enabled": True},
                           "admission": {"onPressure": "reject", "mode": "token-budget", "longPromptTokens": 8192}}},
    "chat-template": {"vllm": {"chatTemplate": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
                               "chatTemplateContentFormat": "openai",
                               "defaultChatTemplateKwargs": {"enable_thinking": False}}},
    "vllm-env": {"vllm": {"env": [
        {"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "1"},
        {"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"},
        {"name": "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
         "valueFrom": {"configMapKeyRef": {"name": "vllm-settings", "key": "allow-long"}}},
        {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
    ]}},
}  # fmt: skip


def render(values: dict[str, Any]) -> dict[str, str]:
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema(values)
        rendered: dict[str, str] = chart.render(values, name="llm", namespace="serving")
    return rendered


def documents(rendered: dict[str, str]) -> Iterator[dict[str, Any]]:
    for path, text in rendered.items():
        if path.endswith(".txt"):
            continue
        for document in yaml.safe_load_all(text):
            if document:
                yield document


def containers(rendered: dict[str, str]) -> dict[str, dict[str, Any]]:
    deployment = next(d for d in documents(rendered) if d["kind"] == "Deployment")
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def flags(args: list[str]) -> dict[str, str | bool]:
    parsed: dict[str, str | bool] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if arg.startswith("--"):
            if index + 1 < len(args) and not args[index + 1].startswith("--"):
                parsed[arg] = args[index + 1]
                index += 2
                continue
            parsed[arg] = True
        index += 1
    return parsed


def test_lint() -> None:
    result = helm.lint(str(CHART))
    assert result["errors"] == []
    assert all(m["severity"] <= 1 for m in result["messages"]), result["messages"]


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_core_objects_are_valid_kubernetes(name: str) -> None:
    kinds = []
    for document in documents(render(VALUE_SETS[name])):
        kinds.append(document["kind"])
        if document["apiVersion"].startswith(("monitoring.coreos.com", "keda.sh", "inference.networking")):
            continue
        kubernetes_validate.validate(document, K8S_VERSION, strict=True)
    assert {"Deployment", "Service", "ServiceAccount", "PodDisruptionBudget"} <= set(kinds)


def _crd_schema(kind: str) -> dict[str, Any]:
    files = {
        "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
        "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
        "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
        "ScaledObject": "keda.sh_scaledobjects.yaml",
        "InferencePool": "inference.networking.k8s.io_inferencepools.yaml",
    }
    crd = yaml.safe_load((CRDS / files[kind]).read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("served", True))
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("name", ["monitoring", "autoscaling", "gateway"])
def test_custom_resources_match_their_crds(name: str) -> None:
    found = []
    for document in documents(render(VALUE_SETS[name])):
        if document["kind"] in {
            "PodMonitor",
            "ServiceMonitor",
            "PrometheusRule",
            "ScaledObject",
            "InferencePool",
        }:
            found.append(document["kind"])
            errors = list(jsonschema.Draft7Validator(_crd_schema(document["kind"])).iter_errors(document))
            assert not errors, [e.message for e in errors]
    assert found


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_vllm_args_and_sidecar_flags_agree(name: str) -> None:
    pods = containers(render(VALUE_SETS[name]))
    vllm = flags(pods["vllm"]["args"])
    sidecar_args = pods["kv-sidecar"]["args"]
    sidecar = flags(sidecar_args)
    for flag in ("--max-model-len", "--max-num-seqs", "--kv-cache-dtype", "--gpu-memory-utilization",
                 "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size",
                 "--enable-expert-parallel", "--max-num-batched-tokens", "--block-size", "--stream-interval",
                 "--enable-lora", "--max-loras", "--max-lora-rank", "--fully-sharded-loras", "--cpu-offload-gb",
                 "--speculative-config", "--exclude-tools-when-tool-choice-none", "--chat-template",
                 "--chat-template-content-format", "--default-chat-template-kwargs", "--tokenizer-mode",
                 "--tokenizer", "--tokenizer-revision"):  # fmt: skip
        assert vllm.get(flag) == sidecar.get(flag), flag
    assert sidecar["--model"] == vllm["--model"]
    assert sidecar["--upstream"] == f"http://127.0.0.1:{pods['vllm']['ports'][0]['containerPort']}"
    expected_weights = {"awq": "int4", "gptq": "int4", "fp8": "fp8"}.get(str(vllm.get("--quantization", "")))
    assert sidecar.get("--weight-dtype") == expected_weights
    args = build_parser().parse_args(sidecar_args)  # the sidecar accepts every flag the chart renders
    assert args.command == "run"
    gpus = pods["vllm"]["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == math.prod(
        int(str(vllm[f"--{kind}-parallel-size"])) for kind in ("tensor", "pipeline", "data")
    )


def test_the_chat_template_is_mounted_where_both_containers_are_told_to_read_it() -> None:
    values = VALUE_SETS["chat-template"]
    rendered = render(values)
    pods = containers(rendered)
    config_map = next(
        d for d in documents(rendered) if d["metadata"]["name"] == "llm-kv-sidecar-chat-template"
    )
    deployment = next(d for d in documents(rendered) if d["kind"] == "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["chat-template"]["configMap"]["name"] == config_map["metadata"]["name"]
    for name in ("vllm", "kv-sidecar"):
        path = Path(str(flags(pods[name]["args"])["--chat-template"]))
        mount = next(m for m in pods[name]["volumeMounts"] if m["name"] == "chat-template")
        assert (str(path.parent), mount["readOnly"]) == (mount["mountPath"], True)
        assert config_map["data"][path.name] == values["vllm"]["chatTemplate"]
    assert not any(d["metadata"]["name"].endswith("chat-template") for d in documents(render({})))


def test_prometheus_rule_is_the_alerts_file_and_dashboards_are_the_json() -> None:
    rendered = render(VALUE_SETS["monitoring"])
    rules = yaml.safe_load((ROOT / "alerts" / "kv-sidecar.rules.yaml").read_text())
    rule = next(d for d in documents(rendered) if d["kind"] == "PrometheusRule")
    assert rule["spec"]["groups"] == rules["groups"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    maps = [d for d in documents(rendered) if d["kind"] == "ConfigMap"]
    by_file = {key: value for m in maps for key, value in m["data"].items()}
    originals = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    assert set(by_file) == set(originals)
    for key, text in by_file.items():
        assert json.loads(text) == json.loads(originals[key])
        assert text == originals[key].rstrip("\n")
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)


def test_admin_token_comes_from_a_secret_and_the_monitors_send_it() -> None:
    rendered = render(VALUE_SETS["monitoring"])
    env = {e["name"]: e for e in containers(rendered)["kv-sidecar"]["env"]}
    assert env["KV_SIDECAR_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "kv-admin", "key": "token"}
    pod_monitor = next(d for d in documents(rendered) if d["kind"] == "PodMonitor")
    admin = next(e for e in pod_monitor["spec"]["podMetricsEndpoints"] if e["port"] == "admin")
    assert admin["authorization"]["credentials"] == {"name": "kv-admin", "key": "token"}
    assert "KV_SIDECAR_ADMIN_TOKEN" not in {e["name"] for e in containers(render({}))["kv-sidecar"]["env"]}


def test_chart_copies_are_the_project_files() -> None:
    assert (CHART / "files" / "kv-sidecar.rules.yaml").read_bytes() == (
        ROOT / "alerts" / "kv-sidecar.rules.yaml"
    ).read_bytes()
    copies = {p.name: p.read_bytes() for p in (CHART / "files" / "dashboards").glob("*.json")}
    assert copies == {p.name: p.read_bytes() for p in (ROOT / "dashboards").glob("*.json")}, (
        "run scripts/sync-chart-files"
    )


def test_pod_shape() -> None:
    rendered = render({})
    deployment = next(d for d in documents(rendered) if d["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    pods = containers(rendered)
    security = pods["kv-sidecar"]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["seccompProfile"]["type"] == "RuntimeDefault"
    tmp_mount = {"name": "sidecar-tmp", "mountPath": "/tmp"}  # noqa: S108 - the manifest's mount, not a temp file
    assert tmp_mount in pods["kv-sidecar"]["volumeMounts"]
    assert pods["kv-sidecar"]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert pods["kv-sidecar"]["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pods["vllm"]["startupProbe"]["httpGet"]["path"] == "/health"
    assert (
        pods["vllm"]["startupProbe"]["failureThreshold"] * pods["vllm"]["startupProbe"]["periodSeconds"]
        >= 600
    )
    drain = flags(pods["kv-sidecar"]["args"])["--drain-timeout"]
    assert spec["terminationGracePeriodSeconds"] > int(str(drain).removesuffix("s"))
    service = next(d for d in documents(rendered) if d["kind"] == "Service")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["http"]["targetPort"] == "proxy"
    assert set(ports) == {"http", "admin"}  # vLLM's own port stays inside the pod
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in pods["kv-sidecar"]["env"]}
    nvml = containers(render(VALUE_SETS["fp8-kv"]))["kv-sidecar"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in nvml["env"]
    assert flags(nvml["args"])["--nvml"] == "auto"


@pytest.mark.parametrize(
    "values",
    [
        {"vllm": {"gpuMemoryUtilization": 1.5}},
        {"vllm": {"maxModelLen": "32k"}},
        {"vllm": {"tensorParallelSize": 0}},
        {"vllm": {"pipelineParallelSize": 0}},
        {"vllm": {"kvCacheDtype": "fp4"}},
        {
            "vllm": {"kvCacheDtype": "bf16"}
        },  # vLLM 0.32's argparse refuses it (bfloat16), so vLLM never starts
        {"vllm": {"lora": {"maxLoraRank": 48}}},
        {"vllm": {"lora": {"maxLoras": 0}}},
        {"vllm": {"cpuOffloadGb": -1}},
        {"vllm": {"speculativeConfig": {"num_speculative_tokens": 2}}},
        {"vllm": {"port": 70000}},
        {"sidecar": {"admission": {"onPressure": "drop"}}},
        {"sidecar": {"admission": {"pressureWindow": "soon"}}},
        {"sidecar": {"gpuMemory": "lots"}},
        {"replicaCount": -1},
        {"model": {"name": ""}},
        {"monitoring": {"podMonitor": {"enabled": "yes"}}},
        {"unknownKey": 1},
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any]) -> None:
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError):
        chart.validate_schema(values)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "nvfp4", "fp8_e5m2", "turboquant_k8v4"])
def test_schema_takes_vllms_kv_cache_dtype_spellings(dtype: str) -> None:
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema({"vllm": {"kvCacheDtype": dtype}})


def test_schema_offers_every_packed_kv_format_the_planner_models_and_only_spellings_it_reads() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    offered = set(schema["properties"]["vllm"]["properties"]["kvCacheDtype"]["enum"])
    assert set(KV_FORMATS) <= offered
    for dtype in offered:
        assert kv_dtype(dtype)  # the sidecar container gets the same flag: it must not refuse it


def test_schema_takes_a_drafter_model_without_a_method() -> None:
    with helm.Chart.load(str(CHART)) as chart:  # vLLM infers the method from the model (eagle3 here)
        chart.validate_schema(
            {"vllm": {"speculativeConfig": {"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}}}
        )


def test_schema_accepts_every_value_set() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        for values in VALUE_SETS.values():
            chart.validate_schema(values)


def test_the_hf_cache_vllm_fills_is_mounted_read_only_into_the_sidecar() -> None:
    rendered = render({"model": {"name": "meta-llama/Llama-3.3-70B-Instruct", "revision": "v1.0"}})
    pods = containers(rendered)
    vllm_env = {e["name"]: e.get("value") for e in pods["vllm"]["env"]}
    sidecar_env = {e["name"]: e.get("value") for e in pods["kv-sidecar"]["env"]}
    assert vllm_env["HF_HOME"] == sidecar_env["HF_HOME"] == "/data/hf"
    assert sidecar_env["HF_HUB_OFFLINE"] == "1"  # the sidecar reads what vLLM downloaded; it never downloads
    assert {"name": "hf-cache", "mountPath": "/data/hf"} in pods["vllm"]["volumeMounts"]
    read_only = {"name": "hf-cache", "mountPath": "/data/hf", "readOnly": True}
    assert read_only in pods["kv-sidecar"]["volumeMounts"]
    for pod in ("vllm", "kv-sidecar"):
        assert flags(pods[pod]["args"])["--model"] == "meta-llama/Llama-3.3-70B-Instruct"
        assert flags(pods[pod]["args"])["--revision"] == "v1.0"
    claimed = render({"hfCache": {"mountPath": "/data/hf", "persistentVolumeClaim": "models"}})
    deployment = next(d for d in documents(claimed) if d["kind"] == "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["hf-cache"]["persistentVolumeClaim"] == {"claimName": "models"}


def test_vllms_compile_cache_is_kept_in_a_volume_so_a_restarted_container_boots_warm() -> None:
    # vLLM's profile charges a cold torch.compile's temporaries as activation (vLLM issues #54122, #54383):
    # VLLM_CACHE_ROOT on a volume keeps the artefacts (0.32.0 puts Inductor's and Triton's under it too)
    def pod(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        rendered = render(values)
        deployment = next(d for d in documents(rendered) if d["kind"] == "Deployment")
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        return containers(rendered)["vllm"], volumes

    vllm, volumes = pod({})
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VLLM_CACHE_ROOT"] == "/data/vllm-cache"
    assert {"name": "compile-cache", "mountPath": "/data/vllm-cache"} in vllm["volumeMounts"]
    assert volumes["compile-cache"] == {"name": "compile-cache", "emptyDir": {"sizeLimit": "20Gi"}}
    claimed = {"enabled": True, "mountPath": "/cache", "persistentVolumeClaim": "vllm-compile"}
    vllm, volumes = pod({"compileCache": claimed})
    assert volumes["compile-cache"]["persistentVolumeClaim"] == {"claimName": "vllm-compile"}
    vllm, volumes = pod({"compileCache": {"enabled": False, "mountPath": "/cache"}})
    assert "compile-cache" not in volumes
    assert "VLLM_CACHE_ROOT" not in {e["name"] for e in vllm["env"]}


def test_the_inference_pool_selects_the_pods_on_the_proxy_port_and_the_epp_reads_the_gateway_series() -> None:
    rendered = render(VALUE_SETS["gateway"])
    docs = list(documents(rendered))
    pool = next(d for d in docs if d["kind"] == "InferencePool")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    proxy_port = next(
        p["containerPort"] for p in containers(rendered)["kv-sidecar"]["ports"] if p["name"] == "proxy"
    )
    assert pool["spec"]["targetPorts"] == [{"number": proxy_port}]
    assert pool["spec"]["endpointPickerRef"]["name"] == "llm-kv-sidecar-epp"
    config_map = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("epp-config")
    )
    epp = yaml.safe_load(config_map["data"]["epp-config.yaml"])
    extractor = next(p for p in epp["plugins"] if p["type"] == "core-metrics-extractor")
    (engine,) = extractor["parameters"]["engineConfigs"]
    assert (
        engine["name"]
        == pod_labels["llm-d.ai/engine-type"]
        == pod_labels["inference.networking.k8s.io/engine-type"]
    )
    assert (engine["queuedRequestsSpec"], engine["runningRequestsSpec"], engine["kvUsageSpec"]) == (
        gateway.QUEUED,
        gateway.RUNNING,
        gateway.KV_USAGE,
    )
    sources = epp["dataLayer"]["sources"]
    assert sources == [
        {"pluginRef": "metrics-data-source", "extractors": [{"pluginRef": "core-metrics-extractor"}]}
    ]


def test_keda_scales_on_the_sidecar_adjusted_queue() -> None:
    scaled = next(d for d in documents(render(VALUE_SETS["autoscaling"])) if d["kind"] == "ScaledObject")
    assert scaled["spec"]["triggers"][0]["metadata"]["query"].startswith(f"sum({gateway.QUEUED}{{")


SIDECAR_SETTINGS = {  # chart value -> the flag it passes; null in values.yaml: the sidecar's own default
    ("admission", "onPressure"): ("--on-pressure", "reject"),
    ("admission", "mode"): ("--admission", "lanes"),
    ("admission", "pressureThreshold"): ("--pressure-threshold", 0.9),
    ("admission", "releaseThreshold"): ("--release-threshold", 0.7),
    ("admission", "pressureWindow"): ("--pressure-window", "10s"),
    ("admission", "longLaneConcurrency"): ("--long-lane-concurrency", 2),
    ("admission", "queueTimeout"): ("--queue-timeout", "5s"),
    ("admission", "queueMaxEntries"): ("--queue-max-entries", 64),
    ("admission", "stalePolicy"): ("--stale-policy", "closed"),
    ("maxBodyBytes",): ("--max-body-bytes", "1MiB"),
    ("scrapeInterval",): ("--scrape-interval", "500ms"),
    ("calmScrapeInterval",): ("--calm-scrape-interval", "2s"),
    ("logLevel",): ("--log-level", "debug"),
}


def test_the_chart_restates_no_sidecar_default() -> None:
    """Each sidecar default is written once, in the sidecar: the chart passes a flag only when it is set."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["sidecar"]
    defaults = flags(containers(render({}))["kv-sidecar"]["args"])
    chosen: dict[str, Any] = {"admission": {}}
    for path, (flag, value) in SIDECAR_SETTINGS.items():
        node = values
        for key in path:
            node = node[key]
        assert node is None, f"sidecar.{'.'.join(path)} restates the sidecar's default"
        assert flag not in defaults
        (chosen["admission"] if path[0] == "admission" else chosen)[path[-1]] = value
    rendered = flags(containers(render({"sidecar": chosen}))["kv-sidecar"]["args"])
    assert {flag: rendered[flag] for flag, _ in SIDECAR_SETTINGS.values()} == {
        flag: str(value) for flag, value in SIDECAR_SETTINGS.values()
    }
    args = [str(a) for a in containers(render({"sidecar": chosen}))["kv-sidecar"]["args"]]
    assert build_parser().parse_args(args).admission == "lanes"  # the sidecar accepts what the chart passes


def test_the_schemas_choices_are_the_sidecars() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["sidecar"]["properties"]
    admission = schema["admission"]["properties"]
    assert set(admission["mode"]["enum"]) - {None} == set(AdmissionMode)
    assert set(admission["onPressure"]["enum"]) - {None} == set(OnPressure)
    assert set(admission["stalePolicy"]["enum"]) - {None} == set(StaleMode)
    lora = json.loads((CHART / "values.schema.json").read_text())["properties"]["vllm"]["properties"]["lora"]
    assert tuple(lora["properties"]["maxLoraRank"]["enum"]) == LORA_RANKS


def test_drafter_lora_and_offload_settings_reach_both_containers_and_the_sidecar_budgets_them() -> None:
    pods = containers(render(VALUE_SETS["lora"]))
    vllm, sidecar_args = flags(pods["vllm"]["args"]), pods["kv-sidecar"]["args"]
    assert (vllm["--enable-lora"], vllm["--max-loras"], vllm["--max-lora-rank"]) == (True, "4", "64")
    assert lora_slots_from_args(build_parser().parse_args(sidecar_args)) == LoraSlots(
        4, 64, fully_sharded=True, target_modules=frozenset({"q_proj", "o_proj"})
    )
    targets = pods["vllm"]["args"].index("--lora-target-modules")
    assert pods["vllm"]["args"][targets + 1 : targets + 3] == ["q_proj", "o_proj"]
    assert "--enable-lora" not in flags(containers(render({}))["vllm"]["args"])
    assert vllm["--cpu-offload-gb"] == "2.5"
    inputs = plan_inputs_from_args(build_parser().parse_args(sidecar_args))
    assert inputs.cpu_offload_bytes == 5 * GIB // 2
    assert inputs.speculative == SpeculativeSettings("ngram", 3)
    assert json.loads(str(vllm["--speculative-config"]))["prompt_lookup_max"] == 4  # vLLM gets it whole


def test_vllms_own_variables_that_the_plan_reads_reach_the_sidecar_and_no_others() -> None:
    # the sidecar plans with vLLM's variables (VLLM_USE_FLASHINFER_SAMPLER, ...) as vLLM reads them
    # (sidecar/deployment_flags.py); set once in vllm.env, they must reach both containers
    pods = containers(render(VALUE_SETS["vllm-env"]))
    vllm_env = {e["name"]: e for e in pods["vllm"]["env"]}
    sidecar_env = {e["name"]: e for e in pods["kv-sidecar"]["env"]}
    for name in VLLM_VARIABLES:
        assert sidecar_env[name] == vllm_env[name]
    assert "VLLM_LOGGING_LEVEL" in vllm_env
    assert "VLLM_LOGGING_LEVEL" not in sidecar_env


def test_a_null_utilisation_leaves_vllm_and_the_sidecar_to_the_engines_default() -> None:
    """vLLM 0.34's extensible KV cache takes the whole device when the flag is unset (and warns below 1.0)."""
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema({"vllm": {"gpuMemoryUtilization": None}})
    pods = containers(render({"vllm": {"gpuMemoryUtilization": None}}))
    for pod in ("vllm", "kv-sidecar"):
        assert "--gpu-memory-utilization" not in pods[pod]["args"]
    default = containers(render({}))
    for pod in ("vllm", "kv-sidecar"):
        assert flags(default[pod]["args"])["--gpu-memory-utilization"] == "0.9"


@pytest.mark.parametrize(
    "extra", [["--tokenizer-mode", "deepseek_v32"], ["--tokenizer-mode=deepseek_v32"], ["--tokenizer-mode"]]
)
def test_the_sidecar_is_told_vllms_tokenizer_mode(extra: list[str]) -> None:
    """Either spelling of ``--tokenizer-mode`` in ``vllm.extraArgs`` reaches the sidecar (its counts' exactness)."""
    pods = containers(render({"vllm": {"extraArgs": extra}}))
    args = build_parser().parse_args(pods["kv-sidecar"]["args"])
    assert args.tokenizer_mode == ("auto" if extra == ["--tokenizer-mode"] else "deepseek_v32")


@pytest.mark.parametrize(
    "extra",
    [
        ["--tokenizer", "acme/tok", "--tokenizer-revision", "v2"],
        ["--tokenizer=acme/tok", "--tokenizer-revision=v2"],
        ["--tokenizer-revision", "v2", "--tokenizer", "acme/tok"],
    ],
)
def test_the_sidecar_counts_with_vllms_separate_tokenizer(extra: list[str]) -> None:
    """vLLM's ``--tokenizer`` and ``--tokenizer-revision`` in ``vllm.extraArgs`` reach the sidecar, either spelling."""
    pods = containers(render({"vllm": {"extraArgs": extra}}))
    args = build_parser().parse_args(pods["kv-sidecar"]["args"])
    assert (args.tokenizer, args.tokenizer_revision) == ("acme/tok", "v2")
    assert args.tokenizer_mode == "auto"  # "--tokenizer" is not "--tokenizer-mode", nor its prefix


@pytest.mark.parametrize(
    "extra", [["--reasoning-effort-map", '{"medium": "low"}'], ['--reasoning-effort-map={"medium": "low"}']]
)
def test_the_sidecar_maps_reasoning_efforts_as_vllm_is_told(extra: list[str]) -> None:
    """vLLM's ``--reasoning-effort-map`` (0.33+) in ``vllm.extraArgs`` reaches the sidecar, either spelling."""
    pods = containers(render({"vllm": {"extraArgs": extra}}))
    args = build_parser().parse_args(pods["kv-sidecar"]["args"])
    assert args.reasoning_effort_map == {"medium": "low"}
