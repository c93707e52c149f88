"""``--speculative-config`` in the plan (``sidecar/budget/speculative.py``): what each drafter adds, and refusals.

The real engine checks the MTP figures (``tests/e2e/test_mtp_drafter.py``); these pin the rules at their edges.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sidecar.budget.architecture import Architecture, architecture_from_config
from sidecar.budget.ledger import PlanRequest, build_ledger
from sidecar.budget.model_runner import ModelRunner
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.cli import build_parser, plan_request_from_args
from sidecar.errors import UsageError
from sidecar.units import GIB

V1, V2 = ModelRunner.V1, ModelRunner.V2

DEEPSEEK: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 1024,
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2048,
    "moe_intermediate_size": 256, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "kv_lora_rank": 256, "q_lora_rank": 512, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 64, "v_head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16", "num_nextn_predict_layers": 1,
}  # fmt: skip


def plan(architecture: Architecture, spec: str | None, **changes: Any) -> PlanRequest:
    settings = SpeculativeSettings.parse(spec) if spec else None
    return PlanRequest(
        architecture=architecture,
        gpu_memory_bytes=24 * GIB,
        max_model_len=4096,
        speculative=settings,
        **changes,
    )


def test_the_loaded_weights_note_names_what_is_beside_the_parameters() -> None:
    model = architecture_from_config(DEEPSEEK)
    note = next(n for n in build_ledger(plan(model, None)).notes if n.startswith("vLLM loads"))
    assert note.endswith(": MLA's decode copies of kv_b_proj")  # bf16: not "embeddings stay 16-bit"


def test_an_mtp_layer_adds_its_kv_to_every_token_and_its_weights_to_every_gpu() -> None:
    model = architecture_from_config(DEEPSEEK)
    plain, mtp = build_ledger(plan(model, None)), build_ledger(plan(model, '{"method": "mtp"}'))
    assert mtp.kv_bytes_per_token * 4 == plain.kv_bytes_per_token * 5  # four layers, and the MTP one
    assert mtp.profile["drafter"] > 0
    assert "drafter" not in plain.profile
    more_activation = mtp.profile["activation"] - plain.profile["activation"]  # the rejection pass
    assert plain.kv_pool_bytes - mtp.kv_pool_bytes == mtp.profile["drafter"] + more_activation
    kv_more = mtp.kv_bytes_total - plain.kv_bytes_total  # the seeds' ledger counts the drafter's weights too
    assert mtp.total_bytes - plain.total_bytes == mtp.profile["drafter"] + kv_more + more_activation
    alias = build_ledger(plan(model, '{"method": "deepseek_mtp", "num_speculative_tokens": 3}'))
    assert alias.profile["drafter"] == mtp.profile["drafter"]  # more draft tokens reuse the same layer


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_a_draftless_method_adds_no_weights_or_kv_only_the_rejection_pass(method: str) -> None:
    model = architecture_from_config(DEEPSEEK)
    spec = f'{{"method": "{method}", "num_speculative_tokens": 3, "prompt_lookup_max": 3}}'
    drafted, plain = (
        build_ledger(plan(model, spec, model_runner=V1)),
        build_ledger(plan(model, None, model_runner=V1)),
    )
    assert "drafter" not in drafted.profile
    assert drafted.kv_bytes_per_token == plain.kv_bytes_per_token
    rows = 256  # the profile's dummy requests on a 24 GiB card
    assert drafted.profile["activation"] - plain.profile["activation"] == 12 * rows * 32000


@pytest.mark.parametrize(
    ("version", "flashinfer_sampler", "plain_bytes", "drafted_bytes"),
    [
        ("0.11.0", True, 14, 14),
        ("0.12.0", True, 14, 22),
        ("0.14.1", True, 14, 22),
        ("0.15.0", True, 14, 26),
        ("0.32.0", None, 14, 26),
        # PyTorch's top-k/top-p sorts the vocabulary in 0.11.1-0.16.x: that plain pass is the larger
        ("0.15.0", None, 38, 38),
    ],
)
def test_the_rejection_pass_sets_the_sampler_peak_as_each_release_holds_it(
    version: str, flashinfer_sampler: bool | None, plain_bytes: int, drafted_bytes: int
) -> None:
    model = architecture_from_config(DEEPSEEK | {"vocab_size": 128256})
    settings = {
        "vllm_version": version, "max_num_seqs": 1024, "max_num_batched_tokens": 8192,
        "flashinfer_sampler": flashinfer_sampler, "model_runner": V1,  # V1's pass; V2 runs none (below)
    }  # fmt: skip
    drafted = build_ledger(plan(model, '{"method": "ngram"}', **settings))
    plain = build_ledger(plan(model, None, **settings))
    rest = plain.profile["activation"] - 1024 * 128256 * plain_bytes  # the forward-free workspaces
    assert drafted.profile["activation"] == rest + 1024 * 128256 * drafted_bytes


def test_the_rejection_pass_runs_on_the_last_pipeline_stage_only() -> None:
    model = architecture_from_config(DEEPSEEK | {"vocab_size": 128256})
    drafted = build_ledger(replace(plan(model, '{"method": "ngram"}'), pipeline_parallel_size=2))
    plain = build_ledger(replace(plan(model, None), pipeline_parallel_size=2))
    assert drafted.stages[0].activation == plain.stages[0].activation
    assert drafted.stages[-1].activation > plain.stages[-1].activation


def test_a_drafter_of_its_own_is_said_to_be_left_out() -> None:
    model = architecture_from_config(DEEPSEEK)
    ledger = build_ledger(
        plan(model, '{"method": "eagle3", "model": "org/draft", "num_speculative_tokens": 3}')
    )
    plain = build_ledger(plan(model, None))
    assert "drafter" not in ledger.profile
    assert ledger.kv_bytes_per_token == plain.kv_bytes_per_token  # only the rejection pass is counted
    assert any("eagle3" in note and "not modelled" in note for note in ledger.notes)


def test_mtp_for_a_config_without_mtp_layers_is_noted_not_refused() -> None:
    model = architecture_from_config(DEEPSEEK | {"num_nextn_predict_layers": 0})
    ledger = build_ledger(plan(model, '{"method": "mtp"}'))  # vLLM assumes one for some families
    assert "drafter" not in ledger.profile
    assert any("mtp" in note and "not modelled" in note for note in ledger.notes)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mtp", "JSON object"),
        ('{"num_speculative_tokens": 2}', 'needs a "method"'),
        ('{"method": "mtp", "num_speculative_tokens": 0}', "above 0"),
        ('{"method": "mtp", "num_speculative_tokens": "2"}', "above 0"),
    ],
)
def test_a_config_vllm_would_not_take_is_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        SpeculativeSettings.parse(text)


def test_the_flag_reaches_the_plan() -> None:
    args = build_parser().parse_args(
        ["plan", "--model", "qwen2.5-7b", "--gpu", "l4", "--speculative-config", '{"method": "ngram"}']
    )
    assert plan_request_from_args(args).speculative == SpeculativeSettings("ngram", 1)


def test_with_pipeline_stages_the_drafter_sits_on_the_last() -> None:
    model = architecture_from_config(DEEPSEEK)
    drafted = build_ledger(replace(plan(model, '{"method": "mtp"}'), pipeline_parallel_size=2))
    plain = build_ledger(replace(plan(model, None), pipeline_parallel_size=2))
    first, last = (d.pool_blocks - p.pool_blocks for d, p in zip(drafted.stages, plain.stages, strict=True))
    assert first == 0  # its KV layer and its weights are the last stage's
    assert last < 0
    assert drafted.kv_pool_blocks == drafted.stages[-1].pool_blocks


def test_the_plan_says_what_the_rejection_pass_costs() -> None:
    model = architecture_from_config(DEEPSEEK | {"vocab_size": 128256})
    notes = build_ledger(plan(model, '{"method": "ngram"}', max_num_seqs=1024, model_runner=V1)).notes
    rejection = [note for note in notes if "rejection sampler" in note]
    assert rejection == [
        "speculative decoding: vLLM's start-up profile also runs its rejection sampler over the dummy "
        "requests' logits, 1.47 GiB more activation peak (in the plan; fewer --max-num-seqs lowers it)"
    ]  # 12 x 1,024 x 128,256 bytes
    old = build_ledger(plan(model, '{"method": "ngram"}', max_num_seqs=1024, vllm_version="0.11.0")).notes
    assert not [note for note in old if "rejection sampler" in note]
    v2 = build_ledger(plan(model, '{"method": "ngram"}', max_num_seqs=1024, model_runner=V2)).notes
    assert not [note for note in v2 if "rejection sampler" in note]


def test_the_v2_runner_profiles_no_rejection_pass_only_a_wider_grammar_bitmask() -> None:
    # V2's _dummy_sampler_run calls its plain sampler only (v1/worker/gpu/model_runner.py, 0.32.0); the
    # structured-output bitmask it keeps holds a row per query token, 1 + k (gpu/structured_outputs.py)
    model = architecture_from_config(DEEPSEEK | {"vocab_size": 128256})
    settings = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "model_runner": V2}
    plain = build_ledger(plan(model, None, **settings))
    drafted = build_ledger(plan(model, '{"method": "ngram", "num_speculative_tokens": 3}', **settings))
    assert drafted.profile["activation"] - plain.profile["activation"] == 1024 * 3 * (128256 // 32) * 4
