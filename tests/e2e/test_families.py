"""The families the defaults sweep found misread, on the real engine: vLLM 0.32 builds the layers the plan counts.

vLLM 0.32 (CPU, 1 GiB of KV, ``max_model_len`` 512) loads the tiny models of ``families_probe.py`` from
checkpoints transformers 5.19 wrote; a checkpoint tensor vLLM had no parameter for would stop the load. The
names of the parameters vLLM built say what each layer holds: a gate in the MLP or not, biases on the
attention, its output and the MLP, LayerNorms with a bias, experts in which layers. Each must be what the plan
reads from config.json (:mod:`sidecar.budget.layer_shape`, :mod:`sidecar.budget.moe`), and the plan's
parameter count must be the checkpoint's. Before: ERNIE 4.5's and EXAONE-MoE's experts were not read (the
tiny ERNIE planned as a dense model), StarCoder2's and Arcee's MLPs were counted with a gate, StarCoder2's
biases and LayerNorm biases were not counted, and MiMo-V2's sliding layers were planned at the full layers'
two KV heads where vLLM gives them four (the full layers' page is then half, and vLLM gives them 256-token
blocks). Step 3.5 (since 2026-12-07): experts in every layer, no shared expert or gate, the sliding layers at
the full layers' heads, and its padded ``layer_types`` read as no list at all (every layer full).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sidecar.budget import load_architecture
from sidecar.budget.architecture import Architecture
from sidecar.budget.kv_terms import kv_pages, layer_kv_bytes_per_token
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.parameters import computed_parameter_count
from sidecar.units import GIB
from tests.harness.checkpoint import tensor_bytes
from tests.harness.vllm import layer_index, made_and_measured

pytestmark = pytest.mark.e2e
PROBE = Path(__file__).with_name("families_probe.py")
CHECKPOINTS = ["ernie-moe", "starcoder2", "arcee", "exaone-moe", "mimo"]
MODELS = [*CHECKPOINTS, "step"]  # Step 3.5: built by vLLM from config.json, no checkpoint to count


@pytest.fixture(scope="module")
def engine(vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The models' folder and what vLLM built and held for each."""
    return made_and_measured(vllm_env, PROBE, "FAMILIES", tiny_model, tmp_path_factory.mktemp("families"))


def _layer(names: list[str], index: int) -> set[str]:
    """Layer ``index``'s parameter names without the layer prefix: ``mlp.c_fc.bias``."""
    prefix = re.compile(rf"^model\.layers\.{index}\.")
    return {prefix.sub("", n) for n in names if prefix.match(n)}


def _shape_of(layer: set[str]) -> dict[str, bool]:
    """What vLLM's layer holds, in the plan's terms."""
    mlp = {n for n in layer if n.startswith("mlp.") and ".experts." not in n and "shared_expert" not in n}
    return {
        "gated": any("gate_up_proj" in n or "gate_proj" in n for n in mlp),
        "attention_bias": "self_attn.qkv_proj.bias" in layer,
        "output_bias": "self_attn.o_proj.bias" in layer,
        "mlp_bias": any(n.endswith(".bias") for n in mlp if "gate." not in n),
        "norm_bias": "input_layernorm.bias" in layer,
        "qk_norm": "self_attn.q_norm.weight" in layer,
        "experts": any(".experts." in n for n in layer),
    }


def _planned(arch: Architecture, index: int) -> dict[str, bool]:
    moe = arch.moe is not None and arch.moe.is_moe_layer(index)
    shape = arch.shape
    return {
        "gated": shape.gated_mlp and not moe,
        "attention_bias": shape.attention_bias,
        "output_bias": shape.output_bias,
        "mlp_bias": shape.mlp_bias and not moe,
        "norm_bias": shape.norm_bias,
        "qk_norm": shape.qk_norm,
        "experts": moe,
    }


@pytest.mark.parametrize("model", MODELS)
def test_each_layer_holds_what_the_plan_counts(engine: tuple[Path, Any], model: str) -> None:
    root, runs = engine
    arch, names = load_architecture(root / model), runs[model]["parameters"]
    for index in range(arch.num_layers):
        assert _shape_of(_layer(names, index)) == _planned(arch, index), (model, index)


@pytest.mark.parametrize("model", CHECKPOINTS)
def test_the_parameters_are_the_checkpoints(engine: tuple[Path, Any], model: str) -> None:
    root, _ = engine
    arch = load_architecture(root / model)
    checkpoint = sum(tensor_bytes(root / model).values()) // 2  # bf16
    # the routers' e_score_correction_bias (one per expert and MoE layer) is not counted
    router_biases = arch.moe.num_experts * arch.moe.moe_layer_count(arch.num_layers) if arch.moe else 0
    assert computed_parameter_count(arch) == checkpoint - router_biases


def test_step_layers_hold_the_gate_and_the_shared_expert(engine: tuple[Path, Any]) -> None:
    """Step 3.5: a per-head gate in every layer, a shared expert beside the experts of the listed layers."""
    root, runs = engine
    arch, names = load_architecture(root / "step"), runs["step"]["parameters"]
    assert arch.mimo is not None
    assert arch.mimo.head_wise_gate
    for index in range(arch.num_layers):
        layer = _layer(names, index)
        assert "self_attn.g_proj.weight" in layer
        assert any("share_expert" in n for n in layer) is (
            arch.moe is not None and arch.moe.is_moe_layer(index)
        )


@pytest.mark.parametrize("model", MODELS)
def test_the_pool_is_the_engines(engine: tuple[Path, Any], model: str) -> None:
    root, runs = engine
    folder, run = root / model, runs[model]
    arch = load_architecture(folder)
    request = PlanRequest(
        architecture=arch, gpu_memory_bytes=24 * GIB, max_model_len=512, block_size=128,
        kv_cache_memory_bytes=GIB, async_scheduling=False,
    )  # fmt: skip  # the CPU engine's 128-token blocks and 1 GiB (VLLM_CPU_KVCACHE_SPACE)
    ledger = build_ledger(request)
    assert (ledger.block_size, ledger.kv_pool_blocks) == (run["block_size"], run["num_blocks"])
    assert ledger.max_concurrency == round(run["max_concurrency"], 2)
    kinds = arch.kv_kinds
    pages = kv_pages(request, kinds, layer_kv_bytes_per_token(request), ledger.block_size)
    for group in run["groups"]:  # each group's block: 128 tokens, or more where its page was the smaller
        kind = arch.layer_kinds[layer_index(group["layers"][0])]
        assert group["block_size"] == pages.blocks[kind], (model, group)
