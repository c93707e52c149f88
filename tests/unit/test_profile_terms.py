"""vLLM's profile terms at their boundaries: loaded weights, the activation peak, MoE workspaces, non-torch.

Expected values are literals worked out from the model's dimensions (the comments show the arithmetic);
the calibration table (``test_calibration.py``) checks the same terms against real start-up logs.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.budget import PlanRequest, architecture_from_config, build_ledger, resolve_model
from sidecar.budget.model_runner import ModelRunner
from sidecar.budget.profile import estimate_activation_bytes, hopper_or_blackwell, moe_workspace_bytes
from sidecar.budget.vllm_release import VllmRelease
from sidecar.units import GIB, MIB

CONFIGS = Path(__file__).parents[1] / "data" / "hf-configs"
V1, V2 = ModelRunner.V1, ModelRunner.V2
WORKSPACE = 184 * MIB  # PROFILE_WORKSPACE_BYTES, measured on the calibration table
LLAMA_SAMPLER_ROW = 128256 * (2 + 3 * 4)  # one sampler row: bf16 logits + float32 logits, probs, noise
LLAMA_FORWARD_TOKEN = (2 * 4096 + 3 * 14336) * 2  # residual + normed copy + gate/up (2I) + product (I)


def _config(name: str) -> PlanRequest:
    arch = architecture_from_config(json.loads((CONFIGS / name).read_text()))
    return PlanRequest(arch, 80 * GIB, model_runner=V1)  # the calibrated V1 terms (0.19 H100 logs)


@pytest.mark.parametrize(
    ("case", "tokens", "seqs", "tp", "expected"),
    [
        # a 24 GiB card's vllm serve defaults (2048 tokens, 256 rows): the sampler pass is the larger
        ("sampler-bound", None, None, 1, 256 * LLAMA_SAMPLER_ROW + WORKSPACE),
        ("sampler-bound, not sharded by TP", None, None, 2, 256 * LLAMA_SAMPLER_ROW + WORKSPACE),
        # few rows: the forward pass is the larger
        ("forward-bound", 2048, 8, 1, 2048 * LLAMA_FORWARD_TOKEN + WORKSPACE),
        ("forward-bound, MLP sharded by TP", 2048, 8, 2, 2048 * (2 * 4096 + 3 * 14336 // 2) * 2 + WORKSPACE),
        ("forward grows with the batch", 8192, 8, 1, 8192 * LLAMA_FORWARD_TOKEN + WORKSPACE),
        # the boundary: 2048 x 51200 x 2 bytes of forward = R x 1,795,584 bytes of sampler at R = 116.8
        ("just forward-bound", 2048, 116, 1, 2048 * LLAMA_FORWARD_TOKEN + WORKSPACE),
        ("just sampler-bound", 2048, 117, 1, 117 * LLAMA_SAMPLER_ROW + WORKSPACE),
    ],
)
def test_the_activation_peak_is_the_larger_pass(
    case: str, tokens: int | None, seqs: int | None, tp: int, expected: int
) -> None:
    arch = resolve_model("llama-3-8b")
    request = PlanRequest(
        arch, 24 * GIB, max_num_batched_tokens=tokens, max_num_seqs=seqs, tensor_parallel_size=tp,
        model_runner=V1,  # V1's sampler stage (sidecar/budget/sampler_pass.py); V2's is tested below
    )  # fmt: skip
    assert estimate_activation_bytes(request) == expected, case


LLAMA_VOCAB, LLAMA_HIDDEN = 128256, 4096
V2_STATE_SLOT = LLAMA_VOCAB * 4 + 2 * (LLAMA_VOCAB // 32) * 4 + 17_924  # counts, prompt mask, bitmask, tables


@pytest.mark.parametrize(
    ("case", "version", "tokens", "seqs", "expected"),
    [
        # 2,048 tokens, 256 rows: the sampler stage holds 2-byte logits, below the forward; the slots' state stays
        ("forward-bound", "0.32.0", None, None, 2048 * LLAMA_FORWARD_TOKEN + 256 * V2_STATE_SLOT),
        # 8,192 tokens over 1,024 rows: the forward's output, the rows' hidden states, 2-byte logits, argmax scratch
        (
            "sampler-bound",
            "0.29.0",
            1024,
            1024,
            (1024 + 1024) * LLAMA_HIDDEN * 2
            + 1024 * LLAMA_VOCAB * 2
            + 12 * 1024 * 126
            + 1024 * V2_STATE_SLOT,
        ),
        # 0.34 profiles the warm-up sampling parameters too: float32 logits, filtered logits, probabilities
        (
            "0.34's warm-up pass",
            "0.34.0",
            None,
            None,
            (2048 + 256) * LLAMA_HIDDEN * 2 + 256 * LLAMA_VOCAB * 14 + 256 * V2_STATE_SLOT,
        ),
    ],
)
def test_the_v2_runner_samples_without_copies_and_keeps_each_slots_state(
    case: str, version: str, tokens: int | None, seqs: int | None, expected: int
) -> None:
    # V2's dummy slots never had add_request: no float32 copy, no top-k/top-p; its Sampler keeps R x V int32
    # output counts and the packed masks from load_model on (v1/worker/gpu/sample/penalties.py, 0.29.0, 0.32.0)
    arch = resolve_model("llama-3-8b")
    request = PlanRequest(
        arch,
        24 * GIB,
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        vllm_version=version,
        model_runner=V2,
    )
    assert estimate_activation_bytes(request) == expected, case


def test_a_measured_activation_figure_wins_and_chunking_bounds_the_estimate() -> None:
    arch = resolve_model("llama-3-8b")
    assert estimate_activation_bytes(PlanRequest(arch, 24 * GIB, activation_bytes=123)) == 123
    # seed 001 §3.4: 512-token chunks keep the prefill peak at hundreds of MB; a 32K prefill takes GBs
    chunked = estimate_activation_bytes(
        PlanRequest(arch, 24 * GIB, max_num_batched_tokens=512, max_num_seqs=4)
    )
    whole = estimate_activation_bytes(
        PlanRequest(arch, 24 * GIB, max_num_batched_tokens=32768, max_num_seqs=4)
    )
    assert 10 * MIB < chunked < 500 * MIB
    assert whole > 3 * GIB


def test_float32_serving_doubles_the_forward_and_the_logits() -> None:
    arch = resolve_model("llama-3-8b")
    request = PlanRequest(
        arch, 24 * GIB, weight_dtype="fp32", max_num_batched_tokens=2048, max_num_seqs=8, model_runner=V1
    )
    assert estimate_activation_bytes(request) == 2048 * (2 * 4096 + 3 * 14336) * 4 + WORKSPACE


def test_moe_layers_work_in_the_experts_workspace() -> None:
    # Qwen3-30B-A3B on H100 (8192 tokens): TritonExperts' two buffers, per token and routed expert
    # max(I, H) + max(2I, H) = max(768, 2048) + max(1536, 2048) = 4096 bf16 elements, 8 experts a token
    qwen = _config("Qwen--Qwen3-30B-A3B.json")
    assert moe_workspace_bytes(qwen) == 8192 * 8 * 4096 * 2
    # the sampler pass is the larger one (the MoE forward keeps only the residual and its normed copy)
    assert estimate_activation_bytes(qwen) == 1024 * 151936 * 14 + 8192 * 8 * 4096 * 2 + WORKSPACE
    # gpt-oss-20b on Marlin (MXFP4): max(2I, H) + I with I 2880 -> 2944 and H 2880 -> 3072, 4 experts a token
    oss = _config("openai--gpt-oss-20b.json")
    assert moe_workspace_bytes(PlanRequest(oss.architecture, 24 * GIB, max_num_batched_tokens=4096)) == (
        4096 * 4 * (2 * 2944 + 2944) * 2
    )
    # on an H100 vLLM takes OpenAI's Triton kernels instead: one buffer of I per token and expert (TP 2: 1536)
    h100 = PlanRequest(oss.architecture, 80 * GIB, gpu="NVIDIA H100 80GB", tensor_parallel_size=2)
    assert moe_workspace_bytes(h100) == 8192 * 4 * 1536 * 2
    assert moe_workspace_bytes(PlanRequest(resolve_model("llama-3-8b"), 24 * GIB)) == 0  # dense


@pytest.mark.parametrize(
    ("dtype", "per_parameter"),
    [("fp8", 1.0), ("int8", 1.0), ("int4", 0.55)],
)
def test_quantisation_leaves_the_embeddings_and_lm_head_in_16_bit(dtype: str, per_parameter: float) -> None:
    arch = architecture_from_config(
        json.loads((CONFIGS / "meta-llama--Llama-3.1-8B-Instruct.json").read_text())
    )
    ledger = build_ledger(PlanRequest(arch, 80 * GIB, max_model_len=8192, weight_dtype=dtype))
    embeddings = 2 * 128256 * 4096  # untied: the token embeddings and the LM head
    params = ledger.parameters
    rope = 131072 * 128 * 2  # the RoPE cos/sin table, unsharded, 16-bit (sidecar.budget.rope)
    assert ledger.profile["weights"] == rope + round((params - embeddings) * per_parameter + embeddings * 2)
    assert ledger.weights_bytes == round(params * per_parameter)  # the seeds' paper figure is unchanged
    bf16 = build_ledger(PlanRequest(arch, 80 * GIB, max_model_len=8192))
    assert bf16.profile["weights"] - rope == bf16.weights_bytes == params * 2
    # plan says why its two weight figures differ, and says nothing when they agree
    assert any(n.startswith("vLLM loads") and "embeddings and LM head stay 16-bit" in n for n in ledger.notes)
    assert not any(n.startswith("vLLM loads") for n in bf16.notes)


@pytest.mark.parametrize(
    ("version", "tp", "gpu", "expected"),
    [
        ("0.19.0", 1, "NVIDIA H100 80GB", 256 * MIB),  # vLLM 0.19 logs 0.24-0.27 GiB at TP 1
        ("0.19.0", 2, "NVIDIA H100 80GB", 256 * MIB + 1850 * MIB),  # 2.06-2.07 GiB at TP 2
        ("0.19.0", 4, "NVIDIA H100 80GB", 256 * MIB + 1850 * MIB),  # 2.13 GiB at TP 4
        ("0.32.0", 8, "NVIDIA B200", 256 * MIB + 1850 * MIB),
        ("0.10.1", 2, "NVIDIA H100 80GB", 256 * MIB),  # before 0.11 TP adds nothing the profile sees
        ("0.29.0", 2, "NVIDIA L4", 256 * MIB),  # capability 8.9: no symmetric-memory all-reduce
        ("0.32.0", 4, "NVIDIA A100 80GB", 256 * MIB),  # 8.0
        ("0.32.0", 2, "NVIDIA RTX PRO 6000 Blackwell", 256 * MIB),  # 12.0 is not in vLLM's tables
        ("0.32.0", 2, "custom", 256 * MIB + 1850 * MIB),  # unknown: the larger, safer reservation
    ],
)
def test_non_torch_memory_by_release_tensor_parallel_size_and_gpu(
    version: str, tp: int, gpu: str, expected: int
) -> None:
    release = VllmRelease.parse(version)
    assert release.non_torch_bytes(tp, hopper_or_blackwell=hopper_or_blackwell(gpu)) == expected
    arch = _config("meta-llama--Llama-3.1-8B-Instruct.json").architecture
    request = PlanRequest(arch, 80 * GIB, gpu=gpu, tensor_parallel_size=tp, vllm_version=version)
    assert build_ledger(request).profile["non_torch"] == expected


def test_a_moe_models_dense_layers_and_shared_experts_size_its_forward() -> None:
    # DeepSeek-V3 at TP 8, 8 rows (forward-bound): its first three layers have an ordinary 18432-wide MLP,
    # wider than its one shared expert (2048); the routed experts (2048 / 8 = 256 per GPU) are in the workspace
    deepseek = _config("deepseek-ai--DeepSeek-V3.json")
    request = PlanRequest(
        deepseek.architecture, 80 * GIB, tensor_parallel_size=8, max_num_batched_tokens=8192, max_num_seqs=8,
        model_runner=V1,
    )  # fmt: skip
    workspace = 8192 * 8 * (max(256, 7168) + max(512, 7168)) * 2
    assert moe_workspace_bytes(request) == workspace
    assert (
        estimate_activation_bytes(request) == 8192 * (2 * 7168 + 3 * 18432 // 8) * 2 + workspace + WORKSPACE
    )


@pytest.mark.parametrize(
    ("version", "counts"),
    [
        ("0.26.1", False),
        ("0.27.0", True),
        ("0.29.0", True),
        ("0.30.2", True),
        ("0.31.0", False),
        ("0.32.0", False),
    ],
)
def test_releases_that_count_pinned_profile_segments_say_so_in_the_plan(version: str, counts: bool) -> None:
    # 0.27.0 sized the pool by the drop in free memory; 0.31.0 stopped segments being pinned in the profile
    assert VllmRelease.parse(version).counts_pinned_profile_segments() is counts
    arch = _config("meta-llama--Llama-3.1-8B-Instruct.json").architecture
    notes = build_ledger(PlanRequest(arch, 24 * GIB, vllm_version=version)).notes
    assert any("freed during its start-up profile" in note and "1.6 GiB" in note for note in notes) is counts


@pytest.mark.parametrize(
    ("version", "flashinfer", "rows", "sorts"),
    [
        ("0.7.3", None, 256, False),  # the V0 engine's sampler: planned as before
        ("0.10.1.1", None, 256, False),  # unset means FlashInfer's sampler, where installed (vLLM's image)
        ("0.10.1.1", False, 256, True),  # without it PyTorch's top-k/top-p sorts every row
        ("0.11.0", None, 256, False),
        ("0.11.1", None, 256, True),  # FlashInfer's sampler opt-in from 0.11.1
        ("0.16.0", None, 1024, True),
        ("0.16.0", True, 1024, False),  # VLLM_USE_FLASHINFER_SAMPLER=1
        ("0.17.0", None, 1024, False),  # the Triton kernel filters in place
        ("0.17.0", None, 7, True),  # ... from 8 rows; fewer still sort
        ("0.17.0", None, 8, False),
        ("0.32.0", True, 4, False),
    ],
)
def test_which_releases_sampler_pass_sorts_the_vocabulary(
    version: str, flashinfer: bool | None, rows: int, sorts: bool
) -> None:
    # topk_topp_sampler.py and _dummy_sampler_run read in 0.8.0, 0.9.0, 0.10.1.1, 0.10.2, 0.11.0-0.11.2, 0.15.0-0.17.0
    release = VllmRelease.parse(version)
    assert release.sampler_sorts_vocabulary(rows=rows, flashinfer_sampler=flashinfer) is sorts


@pytest.mark.parametrize(
    ("version", "flashinfer", "bytes_per_logit"),
    [("0.16.0", None, 2 + 4 + 32), ("0.16.0", True, 2 + 3 * 4), ("0.17.0", None, 2 + 3 * 4)],
)
def test_a_sorting_sampler_pass_holds_38_bytes_a_logit(
    version: str, flashinfer: bool | None, bytes_per_logit: int
) -> None:
    # llm-d-planner's version sweep, Qwen3-14B on an H100: torch peak 5.64 GiB on 0.15/0.16, 2.23 on 0.17/0.18
    arch = _config("Qwen--Qwen3-14B.json").architecture
    request = PlanRequest(arch, 80 * GIB, vllm_version=version, flashinfer_sampler=flashinfer)
    assert request.effective_batch == (8192, 1024)
    assert estimate_activation_bytes(request) == 1024 * 151936 * bytes_per_logit + WORKSPACE


def test_a_multimodal_profile_keeps_its_encoder_outputs_through_both_passes() -> None:
    # profile_run caches the encoder's dummy outputs until the sampler pass is done: T x hidden x 2 bytes more
    arch = _config("mistralai--Mistral-Small-3.1-24B-Instruct-2503.json").architecture
    assert arch.vision_parameters
    with_tower = estimate_activation_bytes(PlanRequest(arch, 80 * GIB, vllm_version="0.19.0"))
    text_only = replace(arch, vision_parameters=0)
    without = estimate_activation_bytes(PlanRequest(text_only, 80 * GIB, vllm_version="0.19.0"))
    assert with_tower - without == 8192 * 5120 * 2


@pytest.mark.parametrize(
    ("version", "flashinfer", "noted"),
    [("0.16.0", None, True), ("0.16.0", True, False), ("0.17.0", None, False), ("0.10.1.1", None, False)],
)
def test_a_plan_says_when_the_sampler_pass_sorts_and_what_it_costs(
    version: str, flashinfer: bool | None, noted: bool
) -> None:
    arch = _config("Qwen--Qwen3-14B.json").architecture
    notes = build_ledger(
        PlanRequest(arch, 80 * GIB, vllm_version=version, flashinfer_sampler=flashinfer)
    ).notes
    sorting = [note for note in notes if "sorts the vocabulary" in note]
    assert bool(sorting) is noted
    if noted:  # 1024 rows x 151,936 logits x 24 bytes more than the pass that does not sort
        assert f"{1024 * 151936 * 24 / GIB:.2f} GiB more" in sorting[0]


@pytest.mark.parametrize(
    ("name", "noted"), [("Qwen--Qwen2.5-VL-7B-Instruct.json", True), ("Qwen--Qwen3-8B.json", False)]
)
def test_a_multimodal_plan_says_the_encoders_own_profile_pass_is_left_out(name: str, noted: bool) -> None:
    # profile_run runs the encoder first (GPUModelRunner.profile_run); its peak is not modelled, and a plan
    # must say so for any model with a tower, and not once a measured --activation-memory stands in
    arch = _config(name).architecture
    notes = build_ledger(PlanRequest(arch, 24 * GIB, max_model_len=8192)).notes
    assert any("runs the vision encoder" in note for note in notes) is noted
    measured = build_ledger(PlanRequest(arch, 24 * GIB, max_model_len=8192, activation_bytes=2 * GIB)).notes
    assert not any("runs the vision encoder" in note for note in measured)
