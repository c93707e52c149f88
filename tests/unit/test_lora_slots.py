"""LoRA adapter slots (``sidecar/budget/lora.py``): sizes per GPU by hand from vLLM 0.32's shapes, and refusals;
and ``--cpu-offload-gb``, the other vLLM setting that changes what the weights leave of a GPU.

The expected figures are written out from the tensor shapes in ``vllm/lora/layers/*.py`` (the module's theory
of operation lists them), not from the module's own helpers; ``tests/e2e/test_lora_slots.py`` checks the same
sums against the buffers the real engine allocates.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import pytest

from sidecar.budget.advice import advise
from sidecar.budget.architecture import Architecture, architecture_from_config
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.lora import LORA_RANKS, LoraSlots, class_facts, lora_slot_bytes
from sidecar.budget.profile import rope_cache_bytes
from sidecar.budget.verdict import Verdict
from sidecar.budget.vllm_release import DEFAULT_CUDA_GRAPH_BYTES
from sidecar.cli import build_parser, plan_request_from_args
from sidecar.deployment_flags import cpu_offload_gib, lora_slots_from_args
from sidecar.errors import UsageError
from sidecar.monitor.planning import PlanInputs, resolve_plan_request
from sidecar.signals import parse_vllm_metrics
from sidecar.units import GIB, MIB
from tests.fake_vllm import PRESSURE_PAGE, page

H, VOCAB, RANK = 1024, 32_000, 8
LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 4096,
    "vocab_size": VOCAB, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}  # fmt: skip
EMBEDDINGS = (VOCAB * RANK + H * RANK) + (RANK * H + VOCAB * RANK)  # token embeddings, then the LM head


def arch(**changes: Any) -> Architecture:
    return architecture_from_config({**LLAMA, **changes})


def request(architecture: Architecture, **changes: Any) -> PlanRequest:
    settings: dict[str, Any] = {"gpu_memory_bytes": 24 * GIB, "max_model_len": 4096, **changes}
    return PlanRequest(architecture=architecture, **settings)


def per_layer(q: int, kv: int, inter: int, rank_a: int = RANK, row_out: int = H) -> int:
    """One Llama layer's elements per slot on one GPU: q and kv are this GPU's output widths."""
    qkv = 3 * rank_a * H + (q + 2 * kv) * RANK
    out = RANK * q + row_out * RANK
    gate_up = 2 * rank_a * H + 2 * inter * RANK
    down = RANK * inter + row_out * RANK
    return qkv + out + gate_up + down


@pytest.mark.parametrize(
    ("tp", "fully_sharded", "layer"),
    [
        (1, False, per_layer(q=1024, kv=256, inter=4096)),
        (2, False, per_layer(q=512, kv=128, inter=2048)),
        # two KV heads over four GPUs: each keeps one whole head, as the base layer does
        (4, False, per_layer(q=256, kv=128, inter=1024)),
        (2, True, per_layer(q=512, kv=128, inter=2048, rank_a=RANK // 2, row_out=H // 2)),
    ],
)
def test_a_llama_layers_slots_per_gpu_follow_vllms_shapes(tp: int, fully_sharded: bool, layer: int) -> None:
    slots = LoraSlots(max_loras=3, max_lora_rank=RANK, fully_sharded=fully_sharded)
    got = lora_slot_bytes(request(arch(), tensor_parallel_size=tp), slots)
    assert got == 3 * (2 * layer + EMBEDDINGS) * 2  # three slots, two layers, bf16


def test_classes_without_embedding_slots_and_fused_projections() -> None:
    slots = LoraSlots(max_loras=1, max_lora_rank=RANK)
    qwen2 = arch(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    assert lora_slot_bytes(request(qwen2), slots) == 2 * per_layer(q=1024, kv=256, inter=4096) * 2
    phi3 = arch(architectures=["Phi3ForCausalLM"], model_type="phi3")  # QKV and gate-up fused on disk
    fused = per_layer(q=1024, kv=256, inter=4096) - 2 * RANK * H - RANK * H  # one A slice each
    assert lora_slot_bytes(request(phi3), slots) == (2 * fused + EMBEDDINGS) * 2


MIXTRAL = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 8,
    "num_experts_per_tok": 2, "intermediate_size": 2048,
}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "expert_elements"),
    [
        # experts sliced over two GPUs: all eight, each half as wide
        ({}, 8 * (2 * RANK * H + 2 * 1024 * RANK + RANK * 1024 + H * RANK)),
        # expert parallel: four whole experts per GPU
        ({"enable_expert_parallel": True}, 4 * (2 * RANK * H + 2 * 2048 * RANK + RANK * 2048 + H * RANK)),
        # vLLM before 0.12 gave experts no slots
        ({"vllm_version": "0.11.0"}, 0),
    ],
)
def test_moe_experts_slots_follow_where_the_experts_are(
    changes: dict[str, Any], expert_elements: int
) -> None:
    mixtral = arch(**MIXTRAL)
    attention = 3 * RANK * H + (512 + 2 * 128) * RANK + RANK * 512 + H * RANK
    router = RANK * H + 8 * RANK
    slots = LoraSlots(max_loras=1, max_lora_rank=RANK)
    got = lora_slot_bytes(request(mixtral, tensor_parallel_size=2, **changes), slots)
    assert got == (2 * (attention + router + expert_elements) + EMBEDDINGS) * 2


def test_mla_projections() -> None:
    deepseek = arch(
        architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", num_attention_heads=8,
        kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        n_routed_experts=None,  # dense: the MLA projections and an MLP
    )  # fmt: skip
    down = 2 * RANK * H + (1536 + 512 + 64) * RANK  # fused q_a / kv_a, not split by TP
    query = RANK * 1536 + 8 * 192 * RANK // 2
    kv_up = RANK * 512 + 8 * 256 * RANK // 2
    out = RANK * 8 * 128 // 2 + H * RANK
    mlp = 2 * RANK * H + 2 * 2048 * RANK + RANK * 2048 + H * RANK
    slots = LoraSlots(max_loras=1, max_lora_rank=RANK)
    got = lora_slot_bytes(request(deepseek, tensor_parallel_size=2), slots)
    assert got == 2 * (down + query + kv_up + out + mlp) * 2  # DeepSeek lists no embedding slots


def test_the_pool_loses_the_slots_and_a_second_set_of_cuda_graphs() -> None:
    base = request(arch())
    slots = LoraSlots(max_loras=4, max_lora_rank=64)
    without, with_lora = build_ledger(base), build_ledger(replace(base, lora=slots))
    lora = lora_slot_bytes(base, slots)
    assert with_lora.profile["lora"] == with_lora.lora_bytes == lora > 0
    assert with_lora.profile["cuda_graphs"] == 2 * DEFAULT_CUDA_GRAPH_BYTES
    assert without.kv_pool_bytes - with_lora.kv_pool_bytes == lora + DEFAULT_CUDA_GRAPH_BYTES
    assert with_lora.total_bytes - without.total_bytes == lora
    assert "lora" not in without.profile
    measured = build_ledger(replace(base, lora=slots, cuda_graph_bytes=700 * MIB))
    assert measured.profile["cuda_graphs"] == 700 * MIB  # a measured figure already counts both sets


def test_pipeline_stages_share_the_slots_by_their_layers() -> None:
    deep = arch(num_hidden_layers=8)
    ledger = build_ledger(request(deep, pipeline_parallel_size=2, lora=LoraSlots(2, 16)))
    assert [stage.lora for stage in ledger.stages] == [ledger.stages[0].lora] * 2
    assert sum(stage.lora for stage in ledger.stages) == pytest.approx(
        lora_slot_bytes(request(deep), LoraSlots(2, 16)), abs=2
    )
    assert ledger.profile["lora"] == ledger.stages[0].lora


@pytest.mark.parametrize(
    ("changes", "slots", "message"),
    [
        (
            {"architectures": ["FalconForCausalLM"], "model_type": "falcon"},
            LoraSlots(),
            "does not support LoRA",
        ),
        ({"vocab_size": 262_144}, LoraSlots(), "above the 258,048"),
        ({}, LoraSlots(max_lora_rank=8, fully_sharded=True), "must divide by it"),
    ],
)
def test_what_vllm_refuses_to_start_with_is_refused(
    changes: dict[str, Any], slots: LoraSlots, message: str
) -> None:
    tp = 16 if slots.fully_sharded else 1
    heads = {"num_attention_heads": 16} if slots.fully_sharded else {}
    with pytest.raises(UsageError, match=message):
        request(arch(**changes, **heads), tensor_parallel_size=tp, lora=slots)


def test_a_rank_vllm_does_not_accept_is_refused() -> None:
    with pytest.raises(UsageError, match="refuses --max-lora-rank 48"):
        LoraSlots(max_lora_rank=48)


def test_an_unknown_class_is_planned_llama_shaped_and_says_so() -> None:
    unknown = arch(architectures=["NewModelForCausalLM"])
    assert not class_facts("NewModelForCausalLM").known
    slots = LoraSlots(max_loras=1, max_lora_rank=RANK)
    assert lora_slot_bytes(request(unknown), slots) == 2 * per_layer(q=1024, kv=256, inter=4096) * 2
    notes = build_ledger(request(unknown, lora=slots)).notes
    assert any("NewModelForCausalLM" in note and "Llama-shaped" in note for note in notes)


def _plan_args(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["plan", "--model", "qwen2.5-7b", "--gpu", "l4", *extra])


def test_the_plan_flags() -> None:
    args = _plan_args("--enable-lora", "--max-loras", "4", "--max-lora-rank", "64")
    assert plan_request_from_args(args).lora == LoraSlots(4, 64)
    assert lora_slots_from_args(_plan_args("--enable-lora")) == LoraSlots(1, 16)  # vLLM's defaults
    assert plan_request_from_args(_plan_args()).lora is None
    with pytest.raises(UsageError, match="add --enable-lora"):
        lora_slots_from_args(_plan_args("--max-loras", "4"))


def test_a_shared_expert_and_its_gate() -> None:
    qwen2_moe = arch(
        architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=512, shared_expert_intermediate_size=1024, decoder_sparse_step=1,
        mlp_only_layers=[],
    )  # fmt: skip
    attention = 3 * RANK * H + (1024 + 2 * 256) * RANK + RANK * 1024 + H * RANK
    router = RANK * H + 4 * RANK
    experts = 4 * (2 * RANK * H + 2 * 512 * RANK + RANK * 512 + H * RANK)
    shared = 2 * RANK * H + 2 * 1024 * RANK + RANK * 1024 + H * RANK + (RANK * H + 1 * RANK)  # with its gate
    got = lora_slot_bytes(request(qwen2_moe), LoraSlots(max_loras=1, max_lora_rank=RANK))
    assert got == 2 * (attention + router + experts + shared) * 2


LORA_PAGE = "vllm-0.32.0-cpu-tiny-lora.prom"  # the real CPU server with --enable-lora --max-loras 3


def test_the_engine_page_names_its_slots_and_run_budgets_them() -> None:
    served = parse_vllm_metrics(page(LORA_PAGE))
    assert served.max_loras == 3
    assert parse_vllm_metrics(page(PRESSURE_PAGE)).max_loras is None  # no LoRA: no family on 0.32's page
    qwen2 = arch(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    inputs = PlanInputs(architecture=qwen2, gpu_memory_bytes=24 * GIB)
    from_engine = resolve_plan_request(inputs, None, 4096, None, engine_max_loras=served.max_loras)
    assert from_engine is not None
    assert from_engine.lora == LoraSlots(max_loras=3)  # at vLLM's default rank: the page does not say it
    flagged = replace(inputs, lora=LoraSlots(max_loras=3, max_lora_rank=64))
    told = resolve_plan_request(flagged, None, 4096, None, engine_max_loras=3)
    assert told is not None
    assert told.lora == LoraSlots(max_loras=3, max_lora_rank=64)
    without = resolve_plan_request(inputs, None, 4096, None, engine_max_loras=0)  # older pages: max_lora="0"
    assert without is not None
    assert without.lora is None


def test_alternatives_offer_fewer_slots_or_a_lower_rank_that_fit() -> None:
    qwen = request(arch(architectures=["Qwen2ForCausalLM"], model_type="qwen2", num_hidden_layers=24,
                        hidden_size=2048, intermediate_size=8192, max_position_embeddings=32768),
                   max_model_len=32768, gpu_memory_bytes=8 * GIB, lora=LoraSlots(8, 256))  # fmt: skip
    assert build_ledger(qwen).verdict is not Verdict.FITS
    options = {option.description: option for option in advise(qwen)}
    fewer, lower = options["fewer LoRA adapter slots"], options["lower LoRA rank"]
    assert fewer.ledger.verdict is lower.ledger.verdict is Verdict.FITS
    n, rank = fewer.changes["max_loras"], lower.changes["max_lora_rank"]
    assert isinstance(n, int)
    assert isinstance(rank, int)
    assert 1 <= n < 8
    assert rank in LORA_RANKS
    assert rank < 256
    # the most that fit: one more slot, or the next rank up, does not
    assert build_ledger(replace(qwen, lora=LoraSlots(n + 1, 256))).verdict is not Verdict.FITS
    next_rank = LORA_RANKS[LORA_RANKS.index(rank) + 1]
    assert build_ledger(replace(qwen, lora=LoraSlots(8, next_rank))).verdict is not Verdict.FITS


def test_cpu_offload_leaves_layer_weights_off_the_gpu_up_to_the_budget() -> None:
    model = arch(num_hidden_layers=8)
    base = request(model)
    embeddings = 2 * VOCAB * H * 2  # both matrices stay (bf16), and the RoPE tables
    layers = build_ledger(base).profile["weights"] - embeddings - rope_cache_bytes(base)
    assert layers > GIB // 16
    for budget, offloaded in ((GIB // 16, GIB // 16), (100 * GIB, layers)):  # at most every layer's weights
        ledger = build_ledger(replace(base, cpu_offload_bytes=budget))
        assert build_ledger(base).profile["weights"] - ledger.profile["weights"] == offloaded
        assert build_ledger(base).weights_bytes - ledger.weights_bytes == offloaded
        assert ledger.kv_pool_bytes - build_ledger(base).kv_pool_bytes == offloaded
    staged = build_ledger(replace(base, pipeline_parallel_size=2, cpu_offload_bytes=GIB // 32))
    whole = build_ledger(replace(base, pipeline_parallel_size=2))
    assert [a.weights - b.weights for a, b in zip(whole.stages, staged.stages, strict=True)] == [
        GIB // 32
    ] * 2


@pytest.mark.parametrize("text", ["abc", "-1", "nan", "10GiB"])
def test_a_cpu_offload_vllm_would_not_take_is_refused(text: str) -> None:
    with pytest.raises(UsageError, match="--cpu-offload-gb"):
        cpu_offload_gib(text)
    assert cpu_offload_gib("2.5") == 5 * GIB // 2


QKV = 3 * RANK * H + (8 * 128 + 2 * 2 * 128) * RANK  # one Llama layer's packed QKV, per slot
OUT = RANK * 8 * 128 + H * RANK
GATE_UP, DOWN = 2 * RANK * H + 2 * 4096 * RANK, RANK * 4096 + H * RANK


@pytest.mark.parametrize(
    ("targets", "per_slot"),
    [
        (("q_proj",), 2 * QKV),  # a part names its packed layer: the whole QKV keeps its slots
        (("qkv_proj", "o_proj"), 2 * (QKV + OUT)),
        (("up_proj", "down_proj"), 2 * (GATE_UP + DOWN)),
        (("lm_head",), RANK * H + VOCAB * RANK),  # embeddings only when listed
        (("embed_tokens", "v_proj"), VOCAB * RANK + H * RANK + 2 * QKV),
        (("not_a_layer",), 0),
    ],
)
def test_target_modules_keep_slots_only_where_vllm_keeps_them(
    targets: tuple[str, ...], per_slot: int
) -> None:
    slots = LoraSlots(max_loras=2, max_lora_rank=RANK, target_modules=frozenset(targets))
    assert lora_slot_bytes(request(arch(), lora=slots), slots) == 2 * per_slot * 2  # two slots, bf16
    everything = LoraSlots(max_loras=2, max_lora_rank=RANK)
    assert (
        lora_slot_bytes(request(arch(), lora=everything), everything)
        == 2 * (2 * (QKV + OUT + GATE_UP + DOWN) + EMBEDDINGS) * 2
    )


def test_the_target_modules_flag() -> None:
    args = _plan_args("--enable-lora", "--lora-target-modules", "q_proj", "v_proj")
    assert plan_request_from_args(args).lora == LoraSlots(target_modules=frozenset({"q_proj", "v_proj"}))
    with pytest.raises(UsageError, match="--lora-target-modules sizes LoRA adapter slots: add --enable-lora"):
        lora_slots_from_args(_plan_args("--lora-target-modules", "q_proj"))


def test_target_modules_on_a_release_that_may_not_take_them_are_noted() -> None:
    slots = LoraSlots(target_modules=frozenset({"q_proj"}))
    old = build_ledger(request(arch(), lora=slots, vllm_version="0.15.0")).notes
    assert any(note.startswith("--lora-target-modules: vLLM 0.15.0 may not take it") for note in old)
    assert not any("may not take it" in note for note in build_ledger(request(arch(), lora=slots)).notes)
