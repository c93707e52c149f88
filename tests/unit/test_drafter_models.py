"""Drafters with a model of their own in the plan (``sidecar/budget/drafters.py``): EAGLE-3, EAGLE, draft models.

The real CPU engine checks the shapes and the blocks on tiny models (``tests/e2e/test_eagle_drafters.py``);
these pin the rules on published configs and at their edges.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sidecar.budget.advice import advise
from sidecar.budget.architecture import Architecture, architecture_from_config, read_config_file
from sidecar.budget.catalog import resolve_drafter, resolve_gpu
from sidecar.budget.drafters import Drafter
from sidecar.budget.ledger import Ledger, PlanRequest, build_ledger
from sidecar.budget.report import ledger_to_dict
from sidecar.budget.speculative import SpeculativeSettings, infer_method
from sidecar.budget.verdict import Verdict
from sidecar.cli import build_parser, plan_request_from_args
from sidecar.errors import UsageError
from tests.hf_cache import add_model

CONFIGS = Path(__file__).parents[1] / "data" / "hf-configs"
DRAFTERS = Path(__file__).parents[1] / "data" / "drafters"  # published drafter configs, with provenance
GIB = 1 << 30
EAGLE3_LLAMA31_8B: dict[str, Any] = read_config_file(DRAFTERS / "yuhuili--EAGLE3-LLaMA3.1-Instruct-8B.json")


def published(name: str) -> Architecture:
    return architecture_from_config(read_config_file(CONFIGS / f"{name}.json"))


def drafter(config: dict[str, Any]) -> Drafter:
    return Drafter.from_config(config)


def ledger(target: Architecture, spec: SpeculativeSettings | None, **changes: Any) -> Ledger:
    settings: dict[str, Any] = {"gpu_memory_bytes": 24 * GIB, "max_model_len": 8192} | changes
    return build_ledger(PlanRequest(architecture=target, speculative=spec, **settings))


def eagle3(config: dict[str, Any] = EAGLE3_LLAMA31_8B, method: str = "eagle3") -> SpeculativeSettings:
    spec = SpeculativeSettings.parse(json.dumps({"method": method, "model": "org/draft"}))
    return spec.with_drafter(drafter(config))


@pytest.mark.parametrize(
    ("method", "model", "runs"),
    [
        (None, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "eagle3"),
        (None, "yuhuili/EAGLE-LLaMA3-Instruct-8B", "eagle"),
        (None, "meta-llama/Llama-3.2-1B-Instruct", "draft_model"),
        ("draft_model", "/models/llama3-eagle3-head", "eagle3"),  # vLLM reads the name whatever the method
        ("eagle3", "org/plain-head", "eagle3"),  # an EAGLE method stays as given
        ("mtp", None, "mtp"),
        (None, "ngram", "ngram"),
        (None, "z-lab/Qwen3-8B-DFlash", "dflash"),
    ],
)
def test_the_method_is_inferred_as_vllm_infers_it(method: str | None, model: str | None, runs: str) -> None:
    assert infer_method(method, model) == runs


def test_an_eagle3_head_for_llama_31_8b_weighs_what_its_tensors_hold() -> None:
    target = published("meta-llama--Llama-3.1-8B-Instruct")
    drafted, plain = ledger(target, eagle3()), ledger(target, None)
    # one layer (QKV over 2 x 4096), fc 3 x 4096 -> 4096, final norm, a 32,000-row LM head, 16-bit; d2t int64
    elements = 8192 * 6144 + 4096 * 4096 + 3 * 4096 * 14336 + 3 * 4096 + 3 * 4096 * 4096 + 4096 + 32000 * 4096
    assert elements == 424_689_664
    assert drafted.profile["drafter"] == elements * 2 + 32000 * 8 == 849_635_328
    assert (
        drafted.kv_bytes_per_token * 32 == plain.kv_bytes_per_token * 33
    )  # its layer attends like the model's
    more_activation = drafted.profile["activation"] - plain.profile["activation"]  # the rejection pass
    assert plain.kv_pool_bytes - drafted.kv_pool_bytes == drafted.profile["drafter"] + more_activation
    assert any("eagle3" in note and "drafter" in note for note in drafted.notes)


def test_tensor_parallelism_splits_the_heads_layer_and_lm_head_but_not_fc() -> None:
    target = published("meta-llama--Llama-3.1-8B-Instruct")
    at_two = ledger(target, eagle3(), tensor_parallel_size=2).profile["drafter"]
    elements = 8192 * 3072 + 2048 * 4096 + 3 * 4096 * 7168 + 3 * 4096 + 3 * 4096 * 4096 + 4096 + 16000 * 4096
    assert at_two == elements * 2 + 32000 * 8 == 475_293_696


@pytest.mark.parametrize(
    ("changes", "difference"),
    [
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15]}}, -4096 * 4096 * 2),  # two states
        ({"eagle_config": {"use_aux_hidden_state": False}}, -3 * 4096 * 4096 * 2),  # no fc
        ({"target_hidden_size": 2048}, -3 * 2048 * 4096 * 2),  # fc reads narrower states
        ({"norm_before_fc": True}, 3 * 4096 * 2),
        ({"draft_vocab_size": None}, (128256 - 32000) * 4096 * 2 - 32000 * 8),  # the full vocabulary: no map
        ({"num_hidden_layers": 2}, (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336 + 3 * 4096) * 2),
    ],
)
def test_eagle3_config_fields_change_the_head_as_vllm_builds_it(
    changes: dict[str, Any], difference: int
) -> None:
    target = published("meta-llama--Llama-3.1-8B-Instruct")
    base = ledger(target, eagle3()).profile["drafter"]
    assert ledger(target, eagle3(EAGLE3_LLAMA31_8B | changes)).profile["drafter"] - base == difference


def test_an_eagle_head_shares_the_targets_embeddings_and_lm_head() -> None:
    target = published("meta-llama--Llama-3.1-8B-Instruct")
    config = EAGLE3_LLAMA31_8B | {"architectures": ["LlamaForCausalLM"], "draft_vocab_size": None}
    weights = ledger(target, eagle3(config, "eagle")).profile["drafter"]
    layer = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336 + 4096  # the first layer has no input_layernorm
    assert weights == (layer + 2 * 4096 * 4096) * 2  # and fc 2 x 4096 -> 4096; nothing of the vocabulary


def test_a_draft_model_of_another_shape_adds_its_kv_bytes_to_every_block() -> None:
    target, small = (
        published("meta-llama--Llama-3.1-70B-Instruct"),
        published("meta-llama--Llama-3.2-1B-Instruct"),
    )
    spec = SpeculativeSettings.parse('{"model": "meta-llama/Llama-3.2-1B-Instruct"}')
    spec = spec.with_drafter(drafter(read_config_file(CONFIGS / "meta-llama--Llama-3.2-1B-Instruct.json")))
    assert spec.method == "draft_model"
    drafted, plain = (
        ledger(target, s, tensor_parallel_size=4, gpu_memory_bytes=80 * GIB) for s in (spec, None)
    )
    alone = ledger(small, None, tensor_parallel_size=4, gpu_memory_bytes=80 * GIB)
    # 80 layers x 2 KV heads x 128 per GPU against 16 layers x 2 x 64: a tenth more per token, one group
    assert drafted.kv_bytes_per_token - plain.kv_bytes_per_token == 16 * 2 * 2 * 64 * 2
    assert drafted.profile["drafter"] == alone.profile["weights"]  # the whole model, its own RoPE table
    block = 16 * drafted.kv_bytes_per_token
    assert drafted.kv_pool_blocks == drafted.kv_pool_bytes // block


def test_a_draft_model_with_the_targets_rope_shares_its_table() -> None:
    target = published("meta-llama--Llama-3.1-8B-Instruct")
    twin = read_config_file(CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.json") | {"num_hidden_layers": 2}
    spec = SpeculativeSettings.parse('{"model": "org/llama-2-layer"}').with_drafter(drafter(twin))
    alone = ledger(architecture_from_config(twin), None)
    rope = 131072 * 128 * 2  # Llama-3.1's cos/sin table, 16-bit
    assert ledger(target, spec).profile["drafter"] == alone.profile["weights"] - rope


def test_a_drafter_shaped_unlike_a_hybrid_target_is_said_to_be_left_out_of_the_kv() -> None:
    target = published("openai--gpt-oss-20b")  # sliding and full layers
    small = read_config_file(CONFIGS / "meta-llama--Llama-3.2-3B-Instruct.json") | {"vocab_size": 201088}
    spec = SpeculativeSettings.parse('{"model": "org/draft"}').with_drafter(drafter(small))
    drafted, plain = ledger(target, spec), ledger(target, None)
    assert drafted.kv_bytes_per_token == plain.kv_bytes_per_token
    assert drafted.profile["drafter"] > 0
    assert any("not modelled" in note and "KV" in note for note in drafted.notes)


@pytest.mark.parametrize(
    ("architectures", "method"),
    [(["Qwen2ForCausalLM"], "eagle"), (["DeepseekV3ForCausalLM"], "eagle3"), (["MedusaModel"], "eagle")],
)
def test_a_drafter_class_not_modelled_is_noted(architectures: list[str], method: str) -> None:
    target = published("meta-llama--Llama-3.1-8B-Instruct")
    ledger_ = ledger(target, eagle3(EAGLE3_LLAMA31_8B | {"architectures": architectures}, method))
    assert "drafter" not in ledger_.profile
    assert any(method in note and "not modelled" in note for note in ledger_.notes)


def test_the_drafter_resolves_from_the_hf_cache_and_never_stops_the_plan(tmp_path: Path) -> None:
    add_model(tmp_path, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", {"config.json": EAGLE3_LLAMA31_8B})
    spec = SpeculativeSettings.parse('{"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}')
    resolved = resolve_drafter(spec, cache_dir=tmp_path)
    assert resolved is not None
    assert resolved.method == "eagle3"
    assert resolved.own_model
    missing = resolve_drafter(SpeculativeSettings.parse(f'{{"model": "{tmp_path / "nowhere"}"}}'))
    assert missing is not None
    assert missing.drafter is None
    assert missing.drafter_problem
    target = published("meta-llama--Llama-3.1-8B-Instruct")
    assert any(missing.drafter_problem in note for note in ledger(target, missing).notes)


def test_the_flag_reads_a_drafter_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(EAGLE3_LLAMA31_8B))
    args = build_parser().parse_args(
        ["plan", "--model", "llama-3.1-8b", "--gpu", "l4", "--speculative-config",
         json.dumps({"method": "eagle3", "model": str(tmp_path), "num_speculative_tokens": 3})]
    )  # fmt: skip
    request = plan_request_from_args(args)
    assert request.speculative is not None
    assert request.speculative.drafter is not None
    ledger_ = build_ledger(request)
    assert ledger_.profile["drafter"] == 849_635_328
    inputs = ledger_to_dict(ledger_, [])["inputs"]["speculative"]
    assert inputs == {
        "method": "eagle3",
        "num_speculative_tokens": 3,
        "model": str(tmp_path),
        "drafter_read": True,
    }


def test_a_draft_model_vllm_cannot_split_over_the_targets_tp_is_refused_in_one_line() -> None:
    target = published("meta-llama--Llama-3.1-70B-Instruct")
    small = read_config_file(
        CONFIGS / "Qwen--Qwen2.5-1.5B-Instruct.json"
    )  # 12 heads: TP 8 splits none evenly
    spec = SpeculativeSettings.parse('{"model": "Qwen/Qwen2.5-1.5B-Instruct"}').with_drafter(drafter(small))
    with pytest.raises(UsageError, match=r"^the draft model Qwen/Qwen2.5-1.5B-Instruct: .*8"):
        ledger(target, spec, tensor_parallel_size=8, gpu_memory_bytes=80 * GIB)


@pytest.mark.parametrize(
    ("target", "changes", "refused"),
    [
        ("mistralai--Mixtral-8x7B-Instruct-v0.1", {}, True),  # MixtralForCausalLM: no SupportsEagle3
        ("mistralai--Mixtral-8x7B-Instruct-v0.1", {"eagle_config": {"use_aux_hidden_state": False}}, False),
        ("meta-llama--Llama-3.1-8B-Instruct", {}, False),
        ("Qwen--Qwen2.5-VL-7B-Instruct", {}, False),  # not in the table (its module needs torchvision)
    ],
)
def test_an_eagle3_head_on_a_class_that_cannot_feed_it_is_refused(
    target: str, changes: dict[str, Any], refused: bool
) -> None:
    spec = eagle3(EAGLE3_LLAMA31_8B | changes)
    if refused:
        with pytest.raises(UsageError, match=r"^vLLM refuses an EAGLE-3 drafter for MixtralForCausalLM: .*"):
            ledger(published(target), spec, gpu_memory_bytes=80 * GIB)
    else:
        ledger(published(target), spec, gpu_memory_bytes=80 * GIB)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"draft_vocab_size": "32k"}, "draft_vocab_size '32k'"),
        ({"eagle_config": ["norm_before_fc"]}, "eagle_config that is not an object"),
        ({"hidden_size": None}, "hidden_size"),
    ],
)
def test_a_drafter_config_that_cannot_be_read_is_noted_not_a_traceback(
    tmp_path: Path, changes: dict[str, Any], problem: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(EAGLE3_LLAMA31_8B | changes))
    spec = resolve_drafter(
        SpeculativeSettings.parse(json.dumps({"method": "eagle3", "model": str(tmp_path)}))
    )
    assert spec is not None
    assert spec.drafter is None
    assert spec.drafter_problem is not None
    assert problem in spec.drafter_problem
    notes = ledger(published("meta-llama--Llama-3.1-8B-Instruct"), spec).notes
    assert any("not modelled" in note and problem in note for note in notes)


def test_when_the_drafter_is_what_does_not_fit_plan_offers_to_go_without_it() -> None:
    target = published("meta-llama--Llama-3.1-8B-Instruct")
    request = PlanRequest(
        architecture=target,
        gpu_memory_bytes=resolve_gpu("l4").memory_bytes,
        max_model_len=24576,
        gpu="l4",
        speculative=eagle3(),
    )
    without = [option for option in advise(request) if option.description == "no speculative decoding"]
    assert [option.changes for option in without] == [{"speculative_config": "none"}]
    assert without[0].ledger.request.speculative is None
    assert without[0].ledger.verdict is Verdict.FITS
    assert build_ledger(request).verdict is not Verdict.FITS
    assert not [
        o for o in advise(replace(request, speculative=None)) if o.description == "no speculative decoding"
    ]
