"""Hybrid models with recurrent-state layers on the real engine: block size, groups, blocks and concurrency.

vLLM 0.32 loads the tiny Qwen3-Next and Nemotron-H of ``state_probe.py`` (CPU, 1 GiB of KV, ``max_model_len``
512) and sizes its pool as ``sidecar/budget/state_layers.py`` says: each state layer in a group of its own,
its state padded to an attention page, the block raised when a state does not fit one (384 tokens for the
wide Qwen3-Next), and a request holding two blocks per DeltaNet group and three per Mamba2 group with prefix
caching (one without). Before, the plan counted no state: the same models were planned with every block
holding tokens of the one attention layer, four times the concurrency vLLM reports. The tiny Falcon-H1 runs a
Mamba2 mixer beside the attention of each of its two layers: two groups of two layers (attention, state),
which the plan had as one attention group and no state; the tiny LFM2's short convolutions hold a conv
window each, which the plan left out. The tiny Zamba2 runs a Mamba2 mixer in each of its six layers and the
shared attention block before two of them: one attention group and three state groups of two layers, which
the plan had named and left out (a note), planning attention alone.

Served (the wide model, 16 blocks of 384 tokens), three requests growing to 830 tokens preempt straight (two
start in 1 + 6 blocks each and grow to 3 + 6) and not through the sidecar, whose capacity admission reads
the three DeltaNet groups' two blocks per request from the engine's page (before, it found the engine's
figure unexplained and fell back to ``lanes``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.admission.geometry import engine_blocks_per_request, resolve_layout
from sidecar.budget import load_architecture
from sidecar.budget.architecture import architecture_from_config
from sidecar.budget.dtypes import normalise_dtype
from sidecar.budget.kv_groups import kv_groups
from sidecar.budget.kv_terms import layer_kv_bytes_per_token, state_terms
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.parameters import computed_parameter_count
from sidecar.budget.state_layers import SHORT_CONV
from sidecar.units import GIB
from tests.e2e.conftest import serve
from tests.e2e.spikes import straight_then_through
from tests.harness.checkpoint import tensor_bytes
from tests.harness.spike import SpikeConfig
from tests.harness.vllm import VllmServer, probe_runs, run_probe

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("state_probe.py")
RUNS = {  # label: (model folder, plan settings as the probe's engine settings)
    "qwen3next": ("qwen3next", {"mamba_ssm_cache_dtype": "float32"}),
    "qwen3next-wide": ("qwen3next-wide", {"mamba_ssm_cache_dtype": "bfloat16"}),
    "nemotronh": ("nemotronh", {}),
    "nemotronh-no-prefix-caching": ("nemotronh", {"enable_prefix_caching": False}),
    "granite": ("granite", {"mamba_ssm_cache_dtype": "float32"}),
    "granite-conv-fp32": ("granite", {"mamba_ssm_cache_dtype": "float32", "mamba_cache_dtype": "float32"}),
    "falconh1": ("falconh1", {"mamba_ssm_cache_dtype": "float32"}),
    "lfm2": ("lfm2", {}),
    "zamba2": ("zamba2", {"mamba_ssm_cache_dtype": "float32"}),
}


GROWING = SpikeConfig(
    seed=12, long_requests=3, short_requests=0, long_prompt=130, long_output=700, spread_seconds=0.1
)  # in 16 blocks of 384 tokens two start (1 + 6 each) and grow to 3 + 6 each


@pytest.fixture(scope="module")
def engine(vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The models' folder and what vLLM held for each run."""
    root = tmp_path_factory.mktemp("state")
    run_probe(vllm_env, PROBE, "make", str(tiny_model), str(root))
    return root, probe_runs(vllm_env, PROBE, "STATE", "measure", str(root))


def _plan(root: Path, label: str) -> PlanRequest:
    folder, settings = RUNS[label]
    return PlanRequest(
        architecture=load_architecture(root / folder), gpu_memory_bytes=24 * GIB, max_model_len=512,
        block_size=128, kv_cache_memory_bytes=GIB, async_scheduling=False, **settings,
    )  # fmt: skip  # the CPU engine's 128-token blocks and 1 GiB (VLLM_CPU_KVCACHE_SPACE)


@pytest.mark.parametrize("label", list(RUNS))
def test_the_pool_is_planned_as_the_engine_sizes_it(engine: tuple[Path, Any], label: str) -> None:
    root, runs = engine
    run, request = runs[label], _plan(root, label)
    ledger = build_ledger(request)
    assert ledger.block_size == run["block_size"]
    groups = kv_groups(request.architecture.kv_kinds)
    assert (groups.full + groups.state, groups.layers_per_group) == (
        len(run["groups"]),
        len(run["groups"][0]),
    )
    assert ledger.kv_pool_blocks == run["num_blocks"]
    assert ledger.max_concurrency == round(run["max_concurrency"], 2)
    assert run["mamba_cache_mode"] == ("none" if label.endswith("no-prefix-caching") else "align")


@pytest.mark.parametrize("label", list(RUNS))
def test_the_state_dtypes_are_the_engines(engine: tuple[Path, Any], label: str) -> None:
    """--mamba-cache-dtype sets the conv state, and the SSM state unless the flag or the model's hook does."""
    root, runs = engine
    request = _plan(root, label)
    state = request.architecture.state
    assert state is not None
    conv, ssm = state.state_dtypes(
        request.architecture.dtype, request.mamba_cache_dtype, request.mamba_ssm_cache_dtype
    )
    engine_dtypes = [[normalise_dtype(dtype) for dtype in group] for group in runs[label]["state_dtypes"]]
    assert engine_dtypes == [[conv] if state.mixer == SHORT_CONV else [conv, ssm]]


@pytest.mark.parametrize("label", list(RUNS))
def test_admission_reads_the_same_layout_from_the_engine_and_from_the_model(
    engine: tuple[Path, Any], label: str
) -> None:
    root, runs = engine
    run, request = runs[label], _plan(root, label)
    groups = kv_groups(request.architecture.kv_kinds)
    state = state_terms(request, layer_kv_bytes_per_token(request))
    assert state is not None
    shape = (groups.full, groups.sliding, groups.chunked, groups.state)
    block = run["block_size"]
    from_engine = resolve_layout(
        block_size=block, max_model_len=512,
        engine_blocks=engine_blocks_per_request(run["num_blocks"], run["max_concurrency"]), groups=shape,
    ).layout  # fmt: skip
    predicted = resolve_layout(
        block_size=block, max_model_len=512, engine_blocks=None, groups=shape,
        predicted_state_blocks=state.blocks_per_group,
    ).layout  # fmt: skip
    assert from_engine == predicted
    assert predicted is not None
    assert run["num_blocks"] / predicted.blocks(512, block) == pytest.approx(run["max_concurrency"])


@pytest.mark.parametrize(
    "model", ["qwen3next", "qwen3next-wide", "nemotronh", "granite", "falconh1", "lfm2", "zamba2"]
)
def test_the_mixers_are_counted_as_transformers_builds_them(engine: tuple[Path, Any], model: str) -> None:
    """From config.json alone (no weights read): every DeltaNet, Mamba2, attention, MoE and MLP tensor."""
    folder = engine[0] / model
    arch = architecture_from_config(json.loads((folder / "config.json").read_text()))
    assert computed_parameter_count(arch) == sum(tensor_bytes(folder).values()) // 2  # bf16


@pytest.fixture(scope="module")
def state_server(
    vllm_env: Path, engine: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """The wide Qwen3-Next (the CPU's DeltaNet kernel wants heads of 64) served with the harness's 16 blocks
    (of 384 tokens here) and max_model_len 1024."""
    yield from serve(
        vllm_env, engine[0] / "qwen3next-wide", tmp_path_factory, "vllm-state.log",
        ("--mamba-ssm-cache-dtype", "bfloat16"),
    )  # fmt: skip


async def test_through_the_sidecar_growing_requests_on_a_state_model_do_not_preempt(
    state_server: VllmServer, engine: tuple[Path, Any]
) -> None:
    """Capacity admission plans the three DeltaNet groups' six blocks a request; straight, vLLM preempts."""
    _, proxied, layout = await straight_then_through(state_server.url, engine[0] / "qwen3next-wide", GROWING)
    assert proxied.preemptions == 0
    assert layout == {
        "full_attention_groups": 1,
        "sliding_window_groups": 0,
        "sliding_window_cap_blocks": 0,
        "speculative_tokens": 0,
        "state_groups": 3,
        "state_blocks": 2,
    }
