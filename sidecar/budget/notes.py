"""The notes under a plan: what its reader should know that the table does not say."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Final

from sidecar.budget.deepseek_v41 import BLACKWELL_NAMES, v4_notes
from sidecar.budget.dtypes import normalise_dtype
from sidecar.budget.kv_groups import kv_groups
from sidecar.budget.lora import TARGET_MODULES_SINCE, class_facts, lora_graph_copies, lora_table_version
from sidecar.budget.model_runner import ModelRunner
from sidecar.budget.pipeline import PipelineStage
from sidecar.budget.profile import (
    ACTIVATION_ELEMENT_BYTES,
    QUANTISED_DTYPES,
    encoder_outputs_bytes,
    estimate_activation_bytes,
    indexer_replicas_bytes,
    mla_absorbed_bytes,
    rope_cache_bytes,
)
from sidecar.budget.speculative import (
    DRAFTLESS_METHODS,
    SpeculativeSettings,
    drafter_kv_layers,
    drafter_kv_modelled,
)
from sidecar.budget.vllm_release import NEWEST_MODELLED, PINNED_SEGMENTS_OBSERVED_BYTES, VllmRelease
from sidecar.units import GIB

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

LOADED_WEIGHTS_NOTE_FRACTION: Final = 0.01
"""A note says so when vLLM loads weights differing from the paper figure by more than this share."""


def plan_notes(
    request: PlanRequest,
    max_concurrency: float,
    weights: tuple[int, int],
    stages: tuple[PipelineStage, ...] = (),
) -> tuple[str, ...]:
    """What a plan's reader should know beyond its table: paper vs loaded weights, limits, replication."""
    notes: list[str] = []
    paper, loaded = weights
    if paper and abs(loaded - paper) > LOADED_WEIGHTS_NOTE_FRACTION * paper:
        why = _loaded_weights_reasons(request, paper)
        notes.append(f"vLLM loads {loaded / GIB:.2f} GiB of weights per GPU, not {paper / GIB:.2f}: {why}")
    arch = request.architecture
    length = request.effective_max_model_len
    if arch.max_position_embeddings and length > arch.max_position_embeddings:
        notes.append(
            f"max_model_len {length} exceeds the model's max_position_embeddings "
            f"{arch.max_position_embeddings}"
        )
    if request.max_num_seqs is not None and request.max_num_seqs < request.concurrency:
        notes.append(
            f"max_num_seqs {request.max_num_seqs} is below the target concurrency {request.concurrency}"
        )
    notes.extend(v4_notes(request))
    if arch.num_kv_heads < request.tensor_parallel_size and arch.mla is None and arch.v4 is None:
        notes.append(
            f"{arch.num_kv_heads} KV heads over {request.tensor_parallel_size} GPUs: "
            "each GPU keeps a full KV head (replicated)"
        )
    notes.extend(_stage_notes(request, stages))
    notes.extend(_lora_notes(request))
    notes.extend(_speculative_notes(request))
    notes.extend(_sorting_sampler_note(request))
    notes.extend(_encoder_pass_note(request))
    if request.cpu_offload_bytes:
        notes.append(
            f"--cpu-offload-gb: vLLM keeps up to {request.cpu_offload_bytes / GIB:.2f} GiB of layer weights "
            "per GPU in CPU memory and reads them over PCIe at every step (slower decoding); the figures "
            "above leave them out"
        )
    if request.release.counts_pinned_profile_segments():
        worst = PINNED_SEGMENTS_OBSERVED_BYTES[1] / GIB
        notes.append(
            f"vLLM {request.release} counts allocator segments freed during its start-up profile as used "
            f"(fixed in 0.31.0): its pool can come out up to {worst:.1f} GiB per GPU smaller than planned; "
            "the sidecar admits by the pool the engine reports"
        )
    if arch.vision_parameters is None and arch.parameter_count is None:
        notes.append(
            f"{arch.class_name or arch.model_type}'s vision (or audio) tower is not in the parameter count: "
            "config.json alone does not give it (the checkpoint's safetensors headers do, from a cached copy "
            "or the Hub); vLLM loads it with the weights unless --language-model-only: they come out larger"
        )
    if arch.unmodelled_features:
        notes.append(
            f"not modelled for this config: {', '.join(arch.unmodelled_features)}; the weights and KV "
            "figures above are approximate (the sidecar admits by the pool the engine reports)"
        )
    if arch.indexer is not None and request.kv_cache_dtype.startswith("fp8"):
        notes.append(
            "FP8 KV with sparse attention: the plan counts MLA's latent at 576 bytes a token and layer, as "
            "vLLM's FlashInfer and FlashAttention sparse backends store it; FlashMLA's stores 656 "
            "(fp8_ds_mla), about 10% fewer tokens in the pool, and vLLM picks the backend by GPU"
        )
    notes.extend(_nvfp4_kv_note(request))
    notes.extend(_release_notes(request))
    if arch.quantization_method == "bitsandbytes" and request.release.at_least(BITSANDBYTES_GONE):
        notes.append(
            f'vLLM {request.release} has no bitsandbytes quantization (on the real 0.32.0 server: "Unknown '
            'quantization method: bitsandbytes"): it does not start with this checkpoint; serve an AWQ, GPTQ '
            "or FP8 one, or a release that still has it"
        )
    if 0 < max_concurrency < request.concurrency:
        notes.append(f"vLLM's pool holds {max_concurrency:.2f} full-length sequences, below the target")
    return tuple(notes)


BITSANDBYTES_GONE: Final = 32
"""The first release checked without bitsandbytes (0.32.0's ``QUANTIZATION_METHODS``; vLLM RFC #39583 proposed
its removal); earlier releases are not claimed either way."""


def _release_notes(request: PlanRequest) -> tuple[str, ...]:
    """A release newer than the newest read, and 0.34's sizing after warm-up (:mod:`~.vllm_release`)."""
    notes = []
    release, newest = request.release, VllmRelease.parse(NEWEST_MODELLED)
    if release > newest:
        notes.append(
            f"vLLM {release} is newer than the newest release whose start-up rules were read ({newest}): "
            f"planned by {newest}'s"
        )
    if request.extensible_kv_cache:
        notes.append(
            f"vLLM {release} sizes the pool after warm-up and CUDA-graph capture (its extensible KV cache): "
            f"gpu_memory_utilization {request.effective_gpu_memory_utilization}, and a margin of max(1 GiB, "
            "0.75 x the activation peak) kept free beside an estimated 0.5 GiB of CUDA context; read in "
            "source, not yet checked against a log of this release"
        )
    return tuple(notes)


def _nvfp4_kv_note(request: PlanRequest) -> tuple[str, ...]:
    """Where vLLM 0.32 refuses NVFP4 KV.

    ``FlashInferBackend.supports_kv_cache_dtype`` and ``supports_combination``
    (``v1/attention/backends/flashinfer.py``): from compute capability 8.0, and not at head size 64 on 8.x,
    9.x and 12.x.
    """
    if normalise_dtype(request.kv_cache_dtype) != "nvfp4":
        return ()
    gpu = request.gpu.lower()
    if any(name in gpu for name in ("v100", "t4")):
        return (
            f"NVFP4 KV runs on FlashInfer from compute capability 8.0: vLLM 0.32 refuses it on {request.gpu}",
        )
    if request.architecture.head_dim == 64 and not any(name in gpu for name in BLACKWELL_NAMES):
        return (
            "NVFP4 KV at head size 64: vLLM 0.32 refuses it outside compute capability 10.x (FlashInfer's "
            "FA2 prefill misreads such a cache)",
        )
    return ()


def _loaded_weights_reasons(request: PlanRequest, paper: int) -> str:
    """Why vLLM's loaded weights differ from the paper figure (:mod:`sidecar.budget.profile`)."""
    dtype = request.effective_weight_dtype
    reasons = []
    if dtype == "mxfp4":
        reasons.append("MXFP4 experts padded to the kernel's tiles")
    elif dtype in QUANTISED_DTYPES:
        reasons.append("embeddings and LM head stay 16-bit")
    if rope_cache_bytes(request) > LOADED_WEIGHTS_NOTE_FRACTION * paper:
        reasons.append("RoPE cos/sin tables on every GPU")
    if mla_absorbed_bytes(request):
        reasons.append("MLA's decode copies of kv_b_proj")
    if indexer_replicas_bytes(request):
        v4 = request.architecture.v4 is not None
        whole = (
            "query and KV down-projections, compressors and indexers" if v4 else "sparse-attention indexers"
        )
        reasons.append(f"the {whole}, whole on every GPU")
    return "; ".join(reasons) or "tensors beside the parameters"


def _rejection_pass_note(request: PlanRequest) -> list[str]:
    """What the profile's rejection-sampler pass adds to the activation peak, when it sets it (V1 only)."""
    if request.effective_model_runner is not ModelRunner.V1:
        return []  # V2's profile samples with its plain sampler only (sidecar.budget.sampler_pass)
    extra = estimate_activation_bytes(request) - estimate_activation_bytes(replace(request, speculative=None))
    if extra <= 0:
        return []
    return [
        f"speculative decoding: vLLM's start-up profile also runs its rejection sampler over the dummy "
        f"requests' logits, {extra / GIB:.2f} GiB more activation peak (in the plan; fewer --max-num-seqs "
        "lowers it)"
    ]


def _sorting_sampler_note(request: PlanRequest) -> list[str]:
    """What sorting the vocabulary in the profile's sampler pass (vLLM 0.11.1-0.16) adds, when it sets it."""
    extra = estimate_activation_bytes(request) - estimate_activation_bytes(
        replace(request, flashinfer_sampler=True)
    )
    if extra <= 0:
        return []
    return [
        f"vLLM {request.release}'s start-up profile sorts the vocabulary in its sampler pass (PyTorch's "
        f"top-k/top-p): {extra / GIB:.2f} GiB more activation peak (in the plan), taken from the KV pool; "
        "vLLM 0.17+, VLLM_USE_FLASHINFER_SAMPLER=1 (for vLLM and the sidecar, where FlashInfer supports the "
        "GPU) or fewer --max-num-seqs lower it"
    ]


def _encoder_pass_note(request: PlanRequest) -> list[str]:
    """What a multimodal plan leaves out: the vision encoder's own pass, the first of vLLM's profile."""
    if request.architecture.vision_parameters == 0 or request.activation_bytes is not None:
        return []
    tokens = request.effective_batch[0]
    held = encoder_outputs_bytes(request, tokens, ACTIVATION_ELEMENT_BYTES)
    return [
        "vLLM's start-up profile first runs the vision encoder on its largest dummy images; the plan counts "
        f"the {held / GIB:.2f} GiB of outputs it keeps, not that pass's own peak, which can be the larger "
        "for towers of large images (Qwen2-VL and later: up to 16,384 tokens an image by default) and then "
        "shrinks the pool; --activation-memory takes the torch peak a deployment's log prints"
    ]


def _speculative_notes(request: PlanRequest) -> list[str]:
    """What speculative decoding adds: the drafter (or what of it the plan leaves out), the rejection pass."""
    spec = request.speculative
    if spec is None:
        return []
    drafter = [] if spec.method in DRAFTLESS_METHODS else _drafter_notes(request, spec)
    return drafter + _rejection_pass_note(request)


def _drafter_notes(request: PlanRequest, spec: SpeculativeSettings) -> list[str]:
    """What the drafter adds, or what of it the plan leaves out."""
    if spec.own_model and spec.drafter is not None:
        drafter = spec.drafter.architecture
        notes = [
            f"speculative decoding ({spec.method}): the drafter {spec.model} ({drafter.num_layers} layer(s), "
            f"hidden {drafter.hidden_size:,}) is loaded on every GPU (the drafter term) and its layers' KV "
            "is in every token's blocks; its share of the profile's activation peak and CUDA graphs is not"
        ]
        if not drafter_kv_modelled(request):
            notes.append(
                "the drafter's KV layers are shaped unlike the model's beside a hybrid or pipelined layout: "
                "not modelled, the pool comes out smaller by their size"
            )
        return notes
    if not spec.modelled or (spec.multi_token_prediction and not drafter_kv_layers(request)):
        why = f" ({spec.drafter_problem})" if spec.drafter_problem else ""
        return [
            f"speculative decoding ({spec.method}): the drafter's weights and KV layers are not "
            f"modelled{why}; the pool comes out smaller by their size"
        ]
    layers = drafter_kv_layers(request)
    return [
        f"speculative decoding ({spec.method}): {layers} MTP layer(s) of the checkpoint run beside the "
        "model, their weights on every GPU (the drafter term) and their KV in every token's blocks"
    ]


def _lora_notes(request: PlanRequest) -> list[str]:
    """What the adapter slots cost and what the plan assumed about them."""
    slots = request.lora
    if slots is None:
        return []
    arch = request.architecture
    notes = [
        f"--enable-lora: {slots.max_loras} adapter slot(s) of rank {slots.max_lora_rank} in every wrapped "
        "layer, allocated with the weights whether adapters are loaded or not"
    ]
    if not class_facts(arch.class_name).known:
        notes.append(
            f"vLLM's LoRA layout for {arch.class_name or 'this model'} is not in the table read from vLLM "
            f"{lora_table_version()}: its adapter slots are planned Llama-shaped, without embedding slots"
        )
    if slots.target_modules and not request.release.at_least(TARGET_MODULES_SINCE):
        notes.append(
            f"--lora-target-modules: vLLM {request.release} may not take it (absent in 0.15.0, present in "
            "0.20.0); without it every layer gets slots"
        )
    if lora_graph_copies(slots, request.release) > 1 and request.cuda_graph_bytes is None:
        notes.append("vLLM captures each CUDA graph with and without adapters: the graph estimate is doubled")
    return notes


def _stage_notes(request: PlanRequest, stages: tuple[PipelineStage, ...]) -> list[str]:
    """Which pipeline stage sets the pool, and whether the stages' KV layout is approximated."""
    if not stages:
        return []
    smallest = min(stages, key=lambda stage: stage.pool_blocks)
    ends = {0: "the embeddings", len(stages) - 1: "the LM head and the sampler"}
    holds = f"{smallest.layers} layers" + (f" and {ends[smallest.index]}" if smallest.index in ends else "")
    blocks = ", ".join(f"{stage.pool_blocks:,}" for stage in stages)
    notes = [
        f"pipeline parallel {len(stages)}: stage {smallest.index + 1} ({holds}) sets the pool "
        f"(blocks per stage: {blocks}; vLLM takes the smallest)"
    ]
    if kv_groups(request.architecture.kv_kinds).hybrid:
        notes.append("pipeline stages of a hybrid KV layout are approximated by their share of each group")
    return notes
