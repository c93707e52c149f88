"""The ledger's boundaries: vLLM's pool, tensor parallelism, windows, activation and verdicts."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.budget import PlanRequest, Verdict, advise, architecture_from_config, build_ledger, resolve_model
from sidecar.budget.sampler_pass import v2_sampler_state_bytes
from sidecar.budget.verdict import TIGHT_HEADROOM_FRACTION
from sidecar.budget.vllm_release import DEFAULT_CUDA_GRAPH_BYTES, VllmRelease
from sidecar.errors import UsageError
from sidecar.units import GIB
from tests.fake_vllm import TINY_CONFIG

TINY = TINY_CONFIG


def test_tiny_model_matches_the_real_vllm_startup_log() -> None:
    # vllm-0.32.0-cpu-startup.log: "KV cache size: 2,048 tokens, Maximum concurrency for 1,024 tokens
    # per request: 2.00x" with 16 blocks of 128 tokens. 2 x 1 x 64 x 2 bytes x 2 layers = 512 B/token.
    arch = architecture_from_config(TINY)
    weights = build_ledger(PlanRequest(arch, GIB, block_size=128)).profile["weights"]  # as loaded
    pool_bytes = 2048 * 512
    request = PlanRequest(
        arch,
        weights + pool_bytes,
        max_model_len=1024,
        block_size=128,
        gpu_memory_utilization=1.0,
        activation_bytes=0,
        non_torch_bytes=0,
        enforce_eager=True,  # the CPU engine captures no CUDA graphs
    )
    ledger = build_ledger(request)
    assert ledger.kv_bytes_per_token == 512
    assert ledger.kv_pool_tokens == 2048
    assert ledger.max_concurrency == 2.0


def test_pool_rounds_down_to_whole_blocks() -> None:
    arch = architecture_from_config(TINY)
    base = PlanRequest(
        arch,
        GIB,
        block_size=16,
        gpu_memory_utilization=1.0,
        activation_bytes=0,
        non_torch_bytes=0,
        cuda_graph_bytes=0,
    )
    weights = build_ledger(base).profile["weights"]  # as loaded, the RoPE table included
    block_bytes = 16 * 512
    for extra, tokens in [
        (block_bytes - 1, 0),
        (block_bytes, 16),
        (2 * block_bytes - 1, 16),
        (2 * block_bytes, 32),
    ]:
        ledger = build_ledger(replace(base, gpu_memory_bytes=weights + extra))
        assert ledger.kv_pool_tokens == tokens


def test_requested_memory_is_ceil_of_utilisation() -> None:
    arch = architecture_from_config(TINY)
    request = PlanRequest(arch, 1001, gpu_memory_utilization=0.5, activation_bytes=0, non_torch_bytes=0)
    ledger = build_ledger(request)
    assert ledger.kv_pool_bytes == max(0, math.ceil(1001 * 0.5) - ledger.weights_bytes)


def test_tensor_parallel_divides_weights_and_kv_per_gpu() -> None:
    one = build_ledger(PlanRequest(resolve_model("llama-3.1-70b"), 80 * GIB, max_model_len=8192))
    two = build_ledger(
        PlanRequest(resolve_model("llama-3.1-70b"), 80 * GIB, max_model_len=8192, tensor_parallel_size=2)
    )
    assert two.weights_bytes == pytest.approx(one.weights_bytes / 2, abs=1)
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2


def test_tensor_parallel_beyond_kv_heads_replicates_one_head() -> None:
    arch = resolve_model("llama-3.1-8b")  # 32 attention heads, 8 KV heads
    tp8 = build_ledger(PlanRequest(arch, 24 * GIB, max_model_len=4096, tensor_parallel_size=8))
    tp16 = build_ledger(PlanRequest(arch, 24 * GIB, max_model_len=4096, tensor_parallel_size=16))
    assert tp8.kv_bytes_per_token == tp16.kv_bytes_per_token == 2 * 1 * 128 * 2 * 32
    assert any("replicated" in note for note in tp16.notes)


@pytest.mark.parametrize(
    ("model", "tp", "heads", "use"),
    [
        ("qwen2.5-7b", 8, 28, "1, 2, 4"),
        ("llama-3.1-70b", 3, 64, "1, 2, 4, 8, 16"),
        ("qwen2.5-7b", 3, 28, "1, 2, 4"),
    ],
)
def test_a_tensor_parallel_size_vllm_refuses_is_refused(model: str, tp: int, heads: int, use: str) -> None:
    # vllm/config/model.py ModelConfig.verify_with_parallel_config (0.32.0): attention heads % tp != 0
    with pytest.raises(
        UsageError, match=rf"refuses --tensor-parallel-size {tp}: .* {heads} attention .* use {use}$"
    ):
        PlanRequest(resolve_model(model), 80 * GIB, max_model_len=4096, tensor_parallel_size=tp)


@pytest.mark.parametrize(
    ("model", "length", "refused"),
    [
        ("llama-3.1-8b", 131072, False),  # rope_type llama3: max_position_embeddings is already scaled
        ("llama-3.1-8b", 131073, True),
        ("qwen2.5-7b", 32768, False),
        ("qwen2.5-7b", 65536, True),
        ("gemma-2-9b", 8192, False),
        ("gemma-2-9b", 32768, True),
    ],
)
def test_a_max_model_len_above_what_the_config_derives_is_refused(
    model: str, length: int, refused: bool
) -> None:
    # vllm/config/model.py _get_and_verify_max_len (0.32.0), unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1
    make = lambda allow: PlanRequest(  # noqa: E731
        resolve_model(model), 80 * GIB, max_model_len=length, allow_long_max_model_len=allow
    )
    if refused:
        with pytest.raises(UsageError, match=r"refuses --max-model-len .*VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"):
            make(False)
    else:
        make(False)
    make(True)


def test_linear_rope_scaling_raises_the_derived_length() -> None:
    config = json.loads((Path(__file__).parents[2] / "sidecar/budget/models/llama-2-7b.json").read_text())
    scaled = architecture_from_config(config | {"rope_scaling": {"type": "linear", "factor": 4.0}})
    assert scaled.derived_max_model_len == 4 * 4096
    yarn = architecture_from_config(config | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert yarn.derived_max_model_len == 4096  # YaRN: already scaled (vLLM 0.30+)


def test_deepseek_mla_per_token() -> None:
    ledger = build_ledger(
        PlanRequest(resolve_model("deepseek-v3"), 141 * GIB, max_model_len=4096, tensor_parallel_size=8)
    )
    assert ledger.kv_bytes_per_token == (512 + 64) * 2 * 61


def test_sliding_window_layers_cap_a_sequence_at_the_window() -> None:
    arch = resolve_model(
        "gemma-2-9b"
    )  # 21 sliding (4096) + 21 full layers, 2 x 8 x 256 x 2 = 8 KiB/layer/token
    per_layer = 2 * 8 * 256 * 2
    ledger = build_ledger(PlanRequest(arch, 48 * GIB, max_model_len=8192))
    assert ledger.kv_bytes_per_token == 42 * per_layer
    assert ledger.kv_bytes_per_sequence == 21 * per_layer * 8192 + 21 * per_layer * 4096
    short = build_ledger(PlanRequest(arch, 48 * GIB, max_model_len=2048))
    assert short.kv_bytes_per_sequence == 42 * per_layer * 2048


@pytest.mark.parametrize(
    ("version", "async_scheduling", "sliding_blocks"),
    [
        ("0.19.0", True, 385),  # one batch in flight: cdiv(4095 + 2048, 16) + 1
        ("0.25.0", True, 385),
        (
            "0.26.0",
            True,
            513,
        ),  # max_in_flight_tokens: two batches with async scheduling, cdiv(4095 + 4096, 16) + 1
        ("0.32.0", True, 513),
        ("0.32.0", False, 385),  # --no-async-scheduling, or vLLM's CPU platform
    ],
)
def test_sliding_window_blocks_per_request_follow_vllm(
    version: str, async_scheduling: bool, sliding_blocks: int
) -> None:
    # A sliding layer needs cdiv(min(window - 1 + in flight, len), block) + 1 blocks, at most a full layer's.
    arch = resolve_model("gemma-2-9b")
    request = PlanRequest(
        arch,
        48 * GIB,
        max_model_len=32768,
        allow_long_max_model_len=True,  # 8K model: the 32K length makes the window visible
        max_num_batched_tokens=2048,
        activation_bytes=0,
        non_torch_bytes=0,
        vllm_version=version,
        async_scheduling=async_scheduling,
    )
    ledger = build_ledger(request)
    # 21 full and 21 sliding layers: two KV cache groups of 21 layers, one block table each
    per_request = 2048 + sliding_blocks
    assert ledger.max_concurrency == round(ledger.kv_pool_blocks / per_request, 2)
    if VllmRelease.parse(version).at_least(22):  # logged as concurrency x length, not blocks x block size
        assert ledger.kv_pool_tokens == int(ledger.kv_pool_blocks / per_request * 32768)


def _request_with_headroom(fraction: float) -> PlanRequest:
    arch = architecture_from_config(TINY)
    probe = build_ledger(PlanRequest(arch, GIB, max_model_len=1024))
    used = probe.total_bytes
    gpu = math.ceil(used / (1 - fraction))
    return PlanRequest(arch, gpu, max_model_len=1024, gpu_memory_utilization=1.0, non_torch_bytes=0)


@pytest.mark.parametrize(
    ("fraction", "verdict"),
    [
        (TIGHT_HEADROOM_FRACTION + 0.01, Verdict.FITS),
        (TIGHT_HEADROOM_FRACTION, Verdict.FITS),  # exactly 10% headroom is enough
        (TIGHT_HEADROOM_FRACTION - 0.01, Verdict.TIGHT),
        (0.0, Verdict.TIGHT),
    ],
)
def test_verdict_at_the_headroom_boundary(fraction: float, verdict: Verdict) -> None:
    assert build_ledger(_request_with_headroom(fraction)).verdict is verdict


def test_one_byte_over_does_not_fit() -> None:
    request = _request_with_headroom(0.0)
    assert (
        build_ledger(replace(request, gpu_memory_bytes=request.gpu_memory_bytes - 1)).verdict
        is Verdict.DOES_NOT_FIT
    )


def test_vllm_concurrency_below_one_does_not_fit_even_if_the_ledger_fits() -> None:
    request = PlanRequest(
        resolve_model("qwen2.5-7b"), 24 * GIB, max_model_len=32768, gpu_memory_utilization=0.62
    )
    ledger = build_ledger(request)
    assert ledger.total_bytes < ledger.gpu_memory_bytes
    assert ledger.max_concurrency < 1
    assert ledger.verdict is Verdict.DOES_NOT_FIT


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"concurrency": 0}, "--concurrency"),
        ({"max_model_len": -1}, "--max-model-len"),
        ({"gpu_memory_utilization": 1.5}, "gpu-memory-utilization"),
        ({"kv_cache_dtype": "fp4"}, "KV cache dtype"),
        ({"weight_dtype": "int3"}, "weight dtype"),
        ({"tensor_parallel_size": 0}, "--tensor-parallel-size"),
    ],
)
def test_invalid_requests_are_usage_errors(changes: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        PlanRequest(resolve_model("qwen2.5-7b"), 24 * GIB, **changes)  # type: ignore[arg-type]


def test_missing_max_model_len_falls_back_to_the_model() -> None:
    ledger = build_ledger(PlanRequest(resolve_model("llama-2-7b"), 24 * GIB))
    assert ledger.kv_bytes_per_sequence == 512 * 1024 * 4096


def test_advice_lists_only_options_that_fit_with_their_totals() -> None:
    request = PlanRequest(resolve_model("qwen2.5-7b"), 24 * GIB, max_model_len=32768, concurrency=4)
    options = advise(request)
    names = [o.description for o in options]
    assert names[0] == "FP8 KV cache"
    assert "INT4 weights" in names
    assert all(o.ledger.verdict is Verdict.FITS for o in options)
    fp8 = options[0].ledger
    assert fp8.kv_bytes_total == 7 * GIB // 2
    fewer = next(o for o in options if o.description == "fewer concurrent sequences")
    assert fewer.changes["concurrency"] in {2, 3}
    shorter = next(o for o in options if o.description == "shorter context")
    longer = replace(request, max_model_len=int(shorter.changes["max_model_len"]) + 1024)
    assert build_ledger(longer).verdict is not Verdict.FITS


def test_no_advice_when_it_fits() -> None:
    assert advise(PlanRequest(resolve_model("qwen2.5-0.5b"), 24 * GIB, max_model_len=4096)) == []


def test_pool_overrides_replace_the_computed_pool() -> None:
    arch = architecture_from_config(TINY)
    blocks = build_ledger(
        PlanRequest(arch, GIB, max_model_len=1024, block_size=128, num_gpu_blocks_override=16)
    )
    assert (blocks.kv_pool_tokens, blocks.max_concurrency) == (2048, 2.0)
    memory = build_ledger(
        PlanRequest(arch, GIB, max_model_len=1024, block_size=128, kv_cache_memory_bytes=2048 * 512)
    )
    assert memory.kv_pool_tokens == 2048


@pytest.mark.parametrize(
    ("version", "gib", "gpu", "batch"),
    [
        ("0.32.0", 24, "l4", (2048, 256)),
        ("0.32.0", 80, "h100", (8192, 1024)),
        ("0.32.0", 80, "a100-80gb", (2048, 256)),  # "a100" not in device_name (0.9.0 on)
        ("0.8.5", 80, "a100-80gb", (8192, 1024)),  # before the A100 exclusion
        ("0.32.0", 141, "h200", (8192, 1024)),
        ("0.32.0", 180, "b200", (16384, 1024)),  # the >= 160 GiB tier (0.28.0 on)
        ("0.27.0", 180, "b200", (8192, 1024)),
        ("0.33.0", 119, "gb10", (2048, 256)),  # DGX Spark keeps the small tier (is_gb10, 0.33.0 on)
        ("0.32.0", 119, "gb10", (8192, 1024)),
    ],
)
def test_vllm_serve_batch_defaults_by_gpu_class_and_release(
    version: str, gib: int, gpu: str, batch: tuple[int, int]
) -> None:
    assert VllmRelease.parse(version).batch_defaults(gib * GIB, gpu, 32768) == batch


def test_unset_batch_defaults_are_clamped_to_the_context_from_0_12() -> None:
    # max_num_batched_tokens <= max_num_seqs x max_model_len; max_num_seqs <= max_num_batched_tokens
    assert VllmRelease.parse("0.32.0").batch_defaults(80 * GIB, "h100", 4) == (4096, 1024)
    assert VllmRelease.parse("0.11.0").batch_defaults(80 * GIB, "h100", 4) == (8192, 1024)


@pytest.mark.parametrize(
    ("version", "eager", "utilization", "graphs"),
    [
        (
            "0.19.0",
            False,
            0.9,
            0,
        ),  # estimate computed, not subtracted (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)
        ("0.20.0", False, 0.92, DEFAULT_CUDA_GRAPH_BYTES),  # on by default, and the default utilisation 0.92
        ("0.32.0", True, 0.92, 0),  # --enforce-eager: no graphs
        ("0.11.0", False, 0.9, 0),
    ],
)
def test_the_release_decides_the_default_utilisation_and_the_cuda_graph_term(
    version: str, eager: bool, utilization: float, graphs: int
) -> None:
    request = PlanRequest(resolve_model("qwen2.5-7b"), 80 * GIB, max_model_len=8192, vllm_version=version,
                          enforce_eager=eager)  # fmt: skip
    ledger = build_ledger(request)
    assert request.effective_gpu_memory_utilization == utilization
    assert ledger.profile["cuda_graphs"] == graphs
    assert ledger.profile["requested"] == math.ceil(80 * GIB * utilization)
    assert ledger.kv_pool_bytes == ledger.profile["requested"] - sum(
        v for k, v in ledger.profile.items() if k != "requested"
    )


@pytest.mark.parametrize(
    ("version", "changes", "utilization", "block", "kept_free"),
    [
        ("0.32.0", {}, 0.92, 16, None),
        ("0.33.0", {}, 0.92, 16, None),
        # 0.34.0: the extensible KV cache sizes the pool after warm-up: the whole device, less the CUDA
        # context, the margin max(1 GiB, 0.75 x activation) and the activation peak; 64-token blocks
        ("0.34.0", {}, 1.0, 64, "context+margin"),
        ("0.34.0", {"gpu_memory_utilization": 0.92}, 0.92, 64, None),  # an explicit budget under the cap
        ("0.34.0", {"num_gpu_blocks_override": 1000}, 0.92, 64, None),  # the pool given: sized as before
        ("0.34.0", {"block_size": 16}, 1.0, 16, "context+margin"),
    ],
)
def test_0_34_sizes_the_pool_after_warm_up_and_blocks_hold_64_tokens(
    version: str, changes: dict[str, object], utilization: float, block: int, kept_free: str | None
) -> None:
    request = PlanRequest(resolve_model("llama-3.1-8b"), 80 * GIB, max_model_len=8192, vllm_version=version,
                          **changes)  # type: ignore[arg-type]  # fmt: skip
    ledger = build_ledger(request)
    assert (request.effective_gpu_memory_utilization, ledger.block_size) == (utilization, block)
    if kept_free is None:
        assert "kept_free" not in ledger.profile
    else:
        transient = ledger.activation_bytes - v2_sampler_state_bytes(request)  # V2's state is not transient
        margin = max(GIB, int(0.75 * transient))
        assert ledger.profile["kept_free"] == 512 * 2**20 + margin  # requested is the whole device
    if "num_gpu_blocks_override" not in changes:
        assert ledger.kv_pool_bytes == ledger.profile["requested"] - sum(
            v for k, v in ledger.profile.items() if k != "requested"
        )


def test_a_release_newer_than_the_newest_read_is_planned_by_its_rules_and_says_so() -> None:
    newest = build_ledger(PlanRequest(resolve_model("qwen2.5-7b"), 80 * GIB, vllm_version="0.34.0"))
    newer = build_ledger(PlanRequest(resolve_model("qwen2.5-7b"), 80 * GIB, vllm_version="0.35.1"))
    assert newer.kv_pool_bytes == newest.kv_pool_bytes
    assert any(
        "newer than the newest release whose start-up rules were read (0.34.0)" in n for n in newer.notes
    )
    assert not any("newer than" in n for n in newest.notes)


@pytest.mark.parametrize(
    ("version", "kv", "refused"),
    [
        ("0.33.0", "float16", True),  # the bf16 model: vLLM 0.33 refuses a 16-bit KV dtype of another kind
        ("0.33.0", "bfloat16", False),
        ("0.33.0", "auto", False),
        ("0.32.0", "float16", False),  # before 0.33 vLLM casts
    ],
)
def test_a_16_bit_kv_dtype_other_than_the_models_is_refused_from_0_33(
    version: str, kv: str, refused: bool
) -> None:
    def plan() -> PlanRequest:
        return PlanRequest(resolve_model("llama-3.1-8b"), 80 * GIB, vllm_version=version, kv_cache_dtype=kv)

    if refused:
        with pytest.raises(UsageError, match="refuses --kv-cache-dtype float16 with a bfloat16 model"):
            plan()
    else:
        plan()


def test_0_34s_margin_comes_off_every_pipeline_stage_too() -> None:
    request = PlanRequest(resolve_model("llama-3.1-70b"), 80 * GIB, max_model_len=32768, vllm_version="0.34.0",
                          tensor_parallel_size=4, pipeline_parallel_size=2)  # fmt: skip
    ledger = build_ledger(request)
    assert "kept_free" in ledger.profile
    block_bytes = ledger.block_size * ledger.kv_bytes_per_token  # the limiting stage's share of the layers
    assert abs(ledger.kv_pool_blocks * block_bytes - ledger.kv_pool_bytes) < block_bytes
