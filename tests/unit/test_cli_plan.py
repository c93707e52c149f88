"""``kv-sidecar plan``: the contract in DESIGN.md and the issue's "done when" cases."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli import main

HEADLINE = [
    "plan",
    "--model",
    "qwen2.5-7b",
    "--gpu",
    "rtx4090",
    "--max-model-len",
    "32768",
    "--concurrency",
    "4",
]
JSON_FIELDS = {
    "kv_bytes_per_token",
    "kv_bytes_per_sequence",
    "kv_bytes_total",
    "weights_bytes",
    "activation_bytes",
    "overhead_bytes",
    "total_bytes",
    "gpu_memory_bytes",
    "kv_pool_bytes",
    "kv_pool_tokens",
    "kv_pool_blocks",
    "max_concurrency",
    "verdict",
    "options",
}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    assert main([*argv, "--format", "json"], environ={}) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_headline_case(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, *HEADLINE)
    assert set(data) >= JSON_FIELDS
    assert data["kv_bytes_per_token"] == 57344
    assert data["kv_bytes_total"] == 7516192768
    assert data["verdict"] == "tight"


def test_llama_and_fp8_halves(capsys: pytest.CaptureFixture[str]) -> None:
    llama = [*HEADLINE[:2], "llama-3.1-8b", *HEADLINE[3:]]
    bf16 = run_json(capsys, *llama)
    fp8 = run_json(capsys, *llama, "--kv-cache-dtype", "fp8")
    assert bf16["kv_bytes_per_token"] == 131072
    assert fp8["kv_bytes_per_token"] == 65536
    assert fp8["kv_bytes_total"] == bf16["kv_bytes_total"] // 2  # type: ignore[operator]
    qwen_fp8 = run_json(capsys, *HEADLINE, "--kv-cache-dtype", "fp8")
    assert qwen_fp8["kv_bytes_per_token"] == 57344 // 2


def test_int4_and_fp8_turn_llama_into_fits(capsys: pytest.CaptureFixture[str]) -> None:
    llama = [*HEADLINE[:2], "llama-3.1-8b", *HEADLINE[3:]]
    assert run_json(capsys, *llama)["verdict"] == "does-not-fit"
    both = run_json(capsys, *llama, "--weight-dtype", "int4", "--kv-cache-dtype", "fp8")
    assert both["verdict"] == "fits"
    options = run_json(capsys, *llama)["options"]
    assert isinstance(options, list)
    assert {
        "description": "INT4 weights and FP8 KV cache",
        "weight_dtype": "int4",
        "kv_cache_dtype": "fp8",
    }.items() <= (next(o for o in options if o["description"] == "INT4 weights and FP8 KV cache").items())


def test_model_directory_with_only_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = Path(__file__).parents[2] / "sidecar" / "budget" / "models" / "qwen2.5-7b.json"
    shutil.copy(source, tmp_path / "config.json")
    from_dir = run_json(capsys, *HEADLINE[:2], str(tmp_path), *HEADLINE[3:])
    from_file = run_json(capsys, *HEADLINE[:2], str(tmp_path / "config.json"), *HEADLINE[3:])
    from_catalog = run_json(capsys, *HEADLINE)
    for field in ("kv_bytes_total", "weights_bytes", "total_bytes", "verdict"):
        assert from_dir[field] == from_file[field] == from_catalog[field]


def test_table_shows_gib_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(HEADLINE, environ={}) == 0
    out = capsys.readouterr().out
    assert "GiB" in out
    assert " GB" not in out
    assert "verdict: tight" in out
    assert "7.00 GiB" in out


def test_environment_sets_flags_and_flags_win(capsys: pytest.CaptureFixture[str]) -> None:
    env = {
        "KV_SIDECAR_MODEL": "llama-3.1-8b",
        "KV_SIDECAR_GPU": "rtx4090",
        "KV_SIDECAR_MAX_MODEL_LEN": "32768",
    }
    assert main(["plan", "--format", "json"], environ=env) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_total"] == 131072 * 32768
    assert main(["plan", "--format", "json", "--max-model-len", "1024"], environ=env) == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_total"] == 131072 * 1024


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--model", "nope-13b", "--gpu", "l4"], "unknown model 'nope-13b'"),
        (["plan", "--model", "qwen2.5-7b", "--gpu-memory", "abc"], "invalid size 'abc'"),
        (["plan", "--model", "qwen2.5-7b", "--gpu", "l4", "--max-model-len", "-5"], "invalid number '-5'"),
        (["plan", "--model", "qwen2.5-7b", "--gpu", "l4", "--concurrency", "0"], "invalid number '0'"),
        (["plan", "--model", "qwen2.5-7b", "--gpu", "tpu"], "unknown GPU 'tpu'"),
        (["plan", "--model", "qwen2.5-7b"], "give --gpu"),
        (["plan", "--gpu", "l4"], "--model is required"),
        (
            ["plan", "--model", "qwen2.5-7b", "--gpu", "l4", "--kv-cache-dtype", "fp4"],
            "invalid KV cache dtype 'fp4'",
        ),
        (["plan", "--bogus"], "unrecognized arguments"),
        ([], "required"),
        (
            ["plan", "--model", "qwen2.5-7b", "--gpu-memory", "24"],
            "a bare number is bytes; write the unit: 24GiB",
        ),
        (
            ["plan", "--model", "qwen2.5-7b", "--gpu", "l4", "--gpu-memory", "24GiB"],
            "--gpu or --gpu-memory, not both",
        ),
        (["plan", "--model", "qwen2.5-7b", "--gpu", "a100"], "ambiguous: use a100-40gb or a100-80gb"),
        (
            ["plan", "--model", "qwen2.5-7b", "--gpu", "h100", "--tensor-parallel-size", "8"],
            "refuses --tensor-pa",
        ),
        (
            ["plan", "--model", "llama-3.1-70b", "--gpu", "h100", "--tensor-parallel-size", "3"],
            "64 attention heads",
        ),
        (["plan", "--model", "qwen2.5-7b", "--gpu", "h100", "--max-model-len", "65536"], "derives 32,768"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, environ={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("kv-sidecar: error: ")
    assert message in err


def test_bad_environment_value_names_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "qwen2.5-7b"], environ={"KV_SIDECAR_GPU_MEMORY": "lots"}) == 2
    assert "KV_SIDECAR_GPU_MEMORY" in capsys.readouterr().err


def test_malformed_config_json_in_a_real_process(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text('{"num_hidden_layers": 4,')
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "plan", "--model", str(tmp_path), "--gpu", "l4"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "is not valid JSON" in result.stderr


def test_console_script_runs_the_headline_case() -> None:
    script = Path(sys.executable).parent / "kv-sidecar"
    result = subprocess.run(
        [str(script), *HEADLINE, "--format", "json"], capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout)["kv_bytes_per_token"] == 57344


def _plan_json(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, object]:
    assert main(["plan", "--model", "qwen2.5-7b", "--format", "json", *flags], environ={}) == 0
    document: dict[str, object] = json.loads(capsys.readouterr().out)
    return document


@pytest.mark.parametrize("spelling", ["24G", "24Gi", "24GiB", "24 GiB", "24g"])
def test_gpu_memory_spellings_all_mean_gib(spelling: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _plan_json(capsys, "--gpu-memory", spelling)["gpu_memory_bytes"] == 24 * 2**30


@pytest.mark.parametrize("spelling", ["fp8_e4m3", "fp8_e5m2", "FP8"])
def test_vllm_spellings_of_the_kv_dtype(spelling: str, capsys: pytest.CaptureFixture[str]) -> None:
    fp8 = _plan_json(capsys, "--gpu", "l4", "--kv-cache-dtype", "fp8")
    assert _plan_json(capsys, "--gpu", "l4", "--kv-cache-dtype", spelling) == fp8


@pytest.mark.parametrize(("gpu", "caveat"), [("a100-80gb", "has no FP8 hardware"), ("h100", None)])
def test_fp8_kv_is_offered_with_a_caveat_where_the_gpu_has_no_fp8(
    gpu: str, caveat: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    document = _plan_json(capsys, "--gpu", gpu, "--max-model-len", "32768", "--concurrency", "40")
    options = {o["description"]: o for o in document["options"]}  # type: ignore[attr-defined]
    said = options["FP8 KV cache"]["caveat"]
    assert said == caveat if caveat is None else caveat in said


def test_fp8_kv_on_an_unknown_gpu_says_it_needs_fp8(capsys: pytest.CaptureFixture[str]) -> None:
    document = _plan_json(capsys, "--gpu-memory", "80GiB", "--max-model-len", "32768", "--concurrency", "40")
    options = {o["description"]: o for o in document["options"]}  # type: ignore[attr-defined]
    assert "needs a GPU with FP8 support" in options["FP8 KV cache"]["caveat"]


def test_more_gpus_when_one_card_cannot_hold_the_weights(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "llama-3.1-70b", "--gpu", "h100", "--max-model-len", "8192", "--format",
                 "json"], environ={}) == 0  # fmt: skip
    options = json.loads(capsys.readouterr().out)["options"]
    assert {"description": "2 GPUs (tensor parallel)", "tensor_parallel_size": 2}.items() <= options[
        -1
    ].items()


def test_a_closed_pipe_ends_plan_quietly() -> None:
    read, write = os.pipe()
    os.close(read)  # the reader (`| head -1`) has already gone
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", *HEADLINE],
        stdout=write,
        stderr=subprocess.PIPE,
        check=False,
        timeout=60,
    )
    os.close(write)
    assert (result.returncode, result.stderr) == (0, b"")


def test_an_environment_variable_that_names_no_flag_is_warned_about(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {"KV_SIDECAR_MODLE": "qwen2.5-7b", "KV_SIDECAR_VLLM_VENV": "/opt/vllm"}  # a typo; a script's own
    assert main([*HEADLINE, "--format", "json"], environ=env) == 0
    err = capsys.readouterr().err
    assert err == "kv-sidecar: warning: KV_SIDECAR_MODLE names no flag; ignored\n"


@pytest.mark.parametrize(("raw", "code"), [("yes", 0), ("0", 0), ("maybe", 2), ("enabled", 2)])
def test_a_boolean_variable_must_read_as_one(raw: str, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*HEADLINE, "--format", "json"], environ={"KV_SIDECAR_ENFORCE_EAGER": raw}) == code
    if code:
        assert "KV_SIDECAR_ENFORCE_EAGER='" in capsys.readouterr().err


def test_run_defaults_are_the_settings_types_defaults() -> None:
    """The CLI writes no default of its own: each comes from the settings type that owns it."""
    from sidecar.admission.decide import AdmissionConfig  # noqa: PLC0415
    from sidecar.admission.outputs import OutputSettings  # noqa: PLC0415
    from sidecar.admission.pressure import PressureSettings, Staleness  # noqa: PLC0415
    from sidecar.admission.tickets import QueueSettings  # noqa: PLC0415
    from sidecar.cli import build_parser  # noqa: PLC0415
    from sidecar.settings import ClientLimits  # noqa: PLC0415

    args = build_parser().parse_args(["run", "--upstream", "http://127.0.0.1:8000"])
    limits, pressure, queue, admission = (
        ClientLimits(),
        PressureSettings(),
        QueueSettings(),
        AdmissionConfig(),
    )
    pairs = {
        "max_body_bytes": limits.max_body_bytes,
        "body_timeout": limits.body_timeout,
        "header_timeout": limits.header_timeout,
        "upstream_timeout": limits.upstream_timeout,
        "tenant_header": limits.tenant_header,
        "pressure_threshold": pressure.enter_threshold,
        "release_threshold": pressure.release_threshold,
        "pressure_window": pressure.window,
        "stale_after": Staleness().after,
        "queue_max_entries": queue.max_entries,
        "queue_max_tokens": queue.max_tokens,
        "queue_timeout": queue.timeout,
        "long_lane_concurrency": admission.long_lane_concurrency,
        "on_pressure": admission.on_pressure,
        "admission": admission.mode.value,
        "output_quantile": OutputSettings().quantile,
        "stream_interval": OutputSettings().stream_interval,
    }
    assert {name: getattr(args, name) for name in pairs} == pairs


def test_vllms_flashinfer_sampler_variable_is_read_as_vllm_reads_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # VLLM_USE_FLASHINFER_SAMPLER (vLLM's envs.py: bool(int(value))): FlashInfer's sampler does not sort the
    # vocabulary in the profile's sampler pass, PyTorch's does up to 0.16 (sidecar/budget/vllm_release.py)
    flags = ["plan", "--model", "qwen2.5-7b", "--gpu", "h100", "--vllm-version", "0.16.0"]
    activation = {}
    for value in ("1", "0"):
        monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", value)
        activation[value] = run_json(capsys, *flags)["activation_bytes"]
    assert activation["0"] == activation["1"] + 1024 * 152064 * 24  # 38 bytes a logit instead of 14
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER")
    assert run_json(capsys, *flags)["activation_bytes"] == activation["0"]  # unset: opt-in from 0.11.1
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "yes")
    assert main(flags) == 2
    err = capsys.readouterr().err
    assert "VLLM_USE_FLASHINFER_SAMPLER='yes'" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("spelling", ["nvfp4", "nvfp4_4over6"])
def test_nvfp4_kv_is_four_and_a_half_bits_an_element(
    spelling: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.32's FlashInfer NVFP4 KV: head/2 bytes of values and head/16 scales for K and for V."""
    bf16 = _plan_json(capsys, "--gpu", "h100", "--kv-cache-dtype", "bf16")
    nvfp4 = _plan_json(capsys, "--gpu", "h100", "--kv-cache-dtype", spelling)
    assert nvfp4["kv_bytes_per_token"] * 2 / 0.5625 == bf16["kv_bytes_per_token"]
    assert not any("NVFP4 KV" in note for note in nvfp4["notes"])  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("model", "gpu", "refused"),
    [("qwen2.5-7b", "h100", None), ("qwen2.5-0.5b", "h100", "head size 64"), ("qwen2.5-0.5b", "b200", None)],
)
def test_nvfp4_kv_says_where_vllm_refuses_it(
    model: str, gpu: str, refused: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    document = _plan_json(capsys, "--model", model, "--gpu", gpu, "--kv-cache-dtype", "nvfp4")
    said = [note for note in document["notes"] if "NVFP4 KV" in note]  # type: ignore[union-attr]
    assert bool(said) is (refused is not None)
    if refused:
        assert refused in said[0]
