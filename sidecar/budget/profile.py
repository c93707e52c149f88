"""vLLM's start-up profile, term by term: the weights it loads and the activation peak it measures.

Theory of operation
-------------------
vLLM sizes its KV pool from what its profile run leaves (:mod:`sidecar.budget.ledger`). Two of the terms
it subtracts depend on the model, and this module computes them; each rule names where it was read.

**Loaded weights** (``loaded_weights_per_gpu``) are not the seeds' "parameters x bytes":

* vLLM builds its RoPE cos/sin tables on the GPU with the model, unsharded: ``max_position x rotary_dim``
  values per table (``RotaryEmbeddingBase``, :mod:`sidecar.budget.rope`). Llama-3.1-8B logs 0.03 GiB above
  its parameters at TP 1, 2 and 4 alike (its 32 MiB table; 0.065 GiB in float32), Llama-4-Scout 2.53 GiB
  (its 10M-position table is 2.5 GiB).
* fp8, int8 and int4 (AWQ, GPTQ) quantise linear layers only. Their ``get_quant_method`` returns a
  quantised method for ``LinearBase`` (and MoE experts) and the unquantised one for the token embeddings
  and, unless the checkpoint says otherwise, the LM head (``vllm/model_executor/layers/quantization/
  fp8.py``, ``auto_awq.py``; read in 0.32.0). On the calibration table, Llama-3.1-8B with
  ``--quantization fp8`` logs 8.49 GiB of weights: 8.46 this way, 7.48 on paper.
* MXFP4 experts (gpt-oss) are stored padded to the MoE kernel's tiles: hidden size to a multiple of
  256, each GPU's expert width to 128 (Marlin: ``Mxfp4MoEMethod.create_weights``, "the moe marlin kernel
  requires that for each linear n % 256 == 0 and k % 128 == 0", read at vllm-project/vllm@007d500;
  ``mxfp4_round_up_hidden_size_and_intermediate_size`` in ``fused_moe/oracle/mxfp4.py``, 0.32.0).
  gpt-oss-120b at TP 4 on A100 logs 17.22 GiB (17.13 padded, 15.17 unpadded); gpt-oss-20b at TP 2 on
  H100, which takes the Triton path, logs 7.01 GiB (7.05 padded, 6.40 unpadded).
* MLA attention (DeepSeek-V2/V3, Kimi) keeps ``kv_b_proj`` for prefill and, after loading, its two halves
  dequantised to the activation dtype for decoding (``W_UK_T`` and ``W_UV``: ``process_weights_after_loading``
  in ``model_executor/layers/attention/mla_attention.py``, 0.20.0 and 0.32.0; ``v1/attention/backends/mla/
  common.py``, 0.10.0): ``kv_lora_rank x heads / tp x (qk_nope + v_head)`` 16-bit elements more per layer
  (``mla_absorbed_bytes``; DeepSeek-V3 at TP 8: 0.24 GiB per GPU). The real CPU engine holds them too
  (``tests/e2e/test_mtp_drafter.py`` sums them on a tiny DeepSeek-V3).

**The activation peak** (``estimate_activation_bytes``): ``profile_run`` pushes a dummy batch of
``T = max_num_batched_tokens`` tokens over ``R = min(max_num_seqs, T)`` sequences through the model
(``_dummy_run``), then samples one row per sequence (``_dummy_sampler_run``, on the last pipeline
stage; ``vllm/v1/worker/gpu_model_runner.py``). The forward's intermediates are freed before the
sampler runs, so the torch peak is the larger of the two passes, not their sum:

* forward: ``T x (2 x hidden + 3 x intermediate / tp)`` 16-bit elements, the residual stream and its
  normed copy beside the MLP's gate/up output (2 x intermediate) and its activated product;
* the sampler stage, and what the model runner keeps beside it, per runner:
  :mod:`sidecar.budget.sampler_pass`;
* MoE layers work in two scratch buffers that vLLM keeps after the forward (``WorkspaceManager``,
  ``vllm/v1/worker/workspace.py``), sized by the experts' ``workspace_shapes``
  (``fused_moe/experts/triton_moe.py``, ``marlin_moe.py``, 0.32.0): ``moe_workspace_bytes``;
* a multimodal model's profile first runs its encoder on a dummy batch of the largest items that fit the
  encoder budget (``max(max_num_batched_tokens, tokens of one item)``) and keeps the outputs in the encoder
  cache through both passes (``GPUModelRunner.profile_run``, read in 0.19.0 and 0.32.0): up to ``T x hidden``
  16-bit elements (:func:`encoder_outputs_bytes`; the budget's tokens, which an item's size divides or
  nearly: 32 Gemma 3 images of 256 tokens, 3 Llama 4 images, 2 Pixtral images of 3,080 tokens). The
  encoder's own pass runs before them and is not modelled: on every boot on the table that prints it, the
  language model's passes are the larger.

Checked against the "torch peak memory increase" that vLLM 0.19 logs on the calibration table's
H100 rows (``T`` 8192, ``R`` 1024): Llama-3.1-8B 1.89 GiB (this model: 1.89), Qwen2.5-7B 2.21 (2.21),
Qwen3-8B 2.21 (2.21), Phi-4 1.52 (1.52), Gemma-2-9B 3.65 (3.60), Granite-3.3-8B 0.85 (0.89, the one
forward-bound row), Qwen3-30B-A3B 2.68 (2.71, with its MoE workspace), gpt-oss-20b 2.87 (2.96, with the
Triton experts' workspace); TP 2 and TP 4 rows log the same peak as TP 1, as the sampler pass is not
sharded. ``test_calibration.py`` bounds each term against its log line. The V0 rows of vLLM 0.6.4
are forward-bound (``T`` = ``max_model_len``) and land within 3-6%.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from sidecar.budget.architecture import Architecture
from sidecar.budget.deepseek_v41 import v41_replicated_extras
from sidecar.budget.dtypes import FLOAT_DTYPES, WEIGHT_DTYPES, normalise_dtype, weight_bytes_per_param
from sidecar.budget.longcat import ATTENTION_BLOCKS
from sidecar.budget.parameters import dense_mlp_width, embedding_parameter_count, expert_parameter_count
from sidecar.budget.rope import FLOAT32_ROPE_TYPES
from sidecar.budget.sampler_pass import profile_peak

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

ACTIVATION_ELEMENT_BYTES: Final = 2
"""Activations are 16-bit whatever the weights are (unless served in float32)."""
QUANTISED_DTYPES: Final = frozenset({"fp8", "int8", "int4", "nvfp4"})
"""Weight dtypes vLLM applies to linear layers only (``get_quant_method`` of its fp8, AWQ, GPTQ configs)."""
MXFP4_HIDDEN_ALIGNMENT: Final = 256
MXFP4_INTERMEDIATE_ALIGNMENT: Final = 128
"""Marlin's MXFP4 MoE tiles: each expert's hidden size padded to 256, its per-GPU intermediate size to 128."""
HOPPER_OR_BLACKWELL_NAMES: Final = ("h100", "h200", "h800", "h20", "gh200", "b100", "b200", "gb200", "b300")
"""GPU names of compute capability 9.0-10.x (see :func:`hopper_or_blackwell`)."""
OLDER_OR_WORKSTATION_NAMES: Final = (
    "a100", "a10", "a30", "a40", "a16", "a6000", "a5000", "a4000", "l4", "l20", "v100", "t4", "p100",
    "rtx", "geforce", "quadro", "titan",
)  # fmt: skip
"""GPU names of compute capability 7.x, 8.x or 12.x (Volta to Ada; RTX Blackwell is 12.0): none of them is
in vLLM's tables for Hopper and data-centre Blackwell (see :func:`hopper_or_blackwell`)."""


def _mxfp4_padded_sizes(hidden_size: int, expert_width: int, width_shards: int) -> tuple[int, int]:
    """``(hidden, per-GPU expert width)`` of MXFP4 experts as vLLM stores them: padded to its tiles."""
    per_gpu = math.ceil(expert_width / width_shards)
    return _round_up(hidden_size, MXFP4_HIDDEN_ALIGNMENT), _round_up(per_gpu, MXFP4_INTERMEDIATE_ALIGNMENT)


def _mxfp4_expert_bytes_per_gpu(request: PlanRequest) -> float:
    """MXFP4 experts on one GPU as vLLM stores them (see :func:`_mxfp4_padded_sizes`)."""
    arch, placement = request.architecture, request.experts
    moe = arch.moe
    if moe is None or placement is None:
        return 0.0
    hidden, intermediate = _mxfp4_padded_sizes(
        arch.hidden_size, moe.expert_intermediate_size, placement.width_shards
    )
    per_layer = placement.experts_per_gpu * 3 * hidden * intermediate
    return per_layer * moe.moe_layer_count(arch.num_layers) * weight_bytes_per_param("mxfp4")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _experts_on_one_gpu(request: PlanRequest) -> tuple[int, float]:
    """``(routed expert parameters, the share of them one GPU holds)``: :mod:`sidecar.budget.experts`."""
    arch, placement, moe = request.architecture, request.experts, request.architecture.moe
    if moe is None or placement is None:
        return 0, 0.0
    padded = moe.padded_width(request.tensor_parallel_size, expert_parallel=request.enable_expert_parallel)
    share = placement.share_of_experts(moe.num_experts) * padded / moe.expert_intermediate_size  # Kimi's
    return expert_parameter_count(arch), share


def _expert_element(request: PlanRequest, dtype: str) -> float:
    """Bytes a routed expert parameter takes: DeepSeek-V4's FP8 checkpoints keep their experts in MXFP4.

    ``DeepseekV4FP8Config.expert_dtype`` (``vllm/models/deepseek_v4/quant_config.py``, 0.32.0): the config's
    ``expert_dtype``, ``fp4`` when absent (DeepSeek-V4-Flash), ``fp8`` for Flash-Base.
    """
    v4 = request.architecture.v4
    mxfp4 = dtype == "fp8" and v4 is not None and v4.mxfp4_experts
    return weight_bytes_per_param("mxfp4" if mxfp4 else dtype)


def paper_weights_per_gpu(request: PlanRequest, params: int) -> int:
    """The seeds' weights on one GPU: every parameter at the dtype's bytes (MXFP4: the experts only).

    Attention and embeddings are split over the engine's tensor-parallel GPUs, the routed experts over
    every GPU of every data-parallel engine (:mod:`sidecar.budget.experts`).
    """
    dtype, tp = request.effective_weight_dtype, request.tensor_parallel_size
    experts, share = _experts_on_one_gpu(request)
    if dtype == "mxfp4":
        quantised = experts * weight_bytes_per_param("mxfp4") * share
        return round(quantised + (params - experts) * weight_bytes_per_param("bf16") / tp)
    element = weight_bytes_per_param(dtype)
    return round((params - experts) * element / tp + experts * _expert_element(request, dtype) * share)


def rope_cache_bytes(request: PlanRequest) -> int:
    """RoPE cos/sin tables on one GPU: every rank and stage holds them all (:mod:`sidecar.budget.rope`).

    In the dtype the model is served in (float32 with ``--dtype float32``; 16-bit for quantised weights),
    or float32 for the families whose vLLM module asks for it.
    """
    arch = request.architecture
    if arch.model_type in FLOAT32_ROPE_TYPES or request.effective_weight_dtype == "fp32":
        return arch.rope_cache_elements * round(WEIGHT_DTYPES["fp32"])
    return arch.rope_cache_elements * ACTIVATION_ELEMENT_BYTES


def loaded_weights_per_gpu(request: PlanRequest, params: int) -> int:
    """The weights one GPU holds once vLLM has loaded them, with the RoPE tables and MLA's decode copies."""
    arch, tp = request.architecture, request.tensor_parallel_size
    dtype = request.effective_weight_dtype
    unquantised = weight_bytes_per_param("bf16")
    beside = rope_cache_bytes(request) + mla_absorbed_bytes(request) + indexer_replicas_bytes(request)
    if arch.moe is not None and arch.moe.expert_hidden_size:  # Kimi K3's latent projections, whole per GPU
        latent = arch.moe.latent_projection_parameters(arch.hidden_size) * arch.moe.moe_layer_count(
            arch.num_layers
        )
        beside += round(latent * weight_bytes_per_param(dtype if dtype != "mxfp4" else "bf16") * (1 - 1 / tp))
    if dtype == "mxfp4":  # only the routed experts are MXFP4; attention, router and embeddings stay bf16
        experts = expert_parameter_count(arch)
        return beside + round((params - experts) * unquantised / tp + _mxfp4_expert_bytes_per_gpu(request))
    if dtype in QUANTISED_DTYPES:  # linear layers only: the embeddings and the LM head stay 16-bit
        experts, share = _experts_on_one_gpu(request)
        embeddings = min(params - experts, embedding_parameter_count(arch))
        quantised = (params - experts - embeddings) * weight_bytes_per_param(dtype)
        spread = experts * _expert_element(request, dtype) * share
        return beside + round((quantised + embeddings * unquantised) / tp + spread)
    return beside + paper_weights_per_gpu(request, params)


def indexer_replicas_bytes(request: PlanRequest) -> int:
    """A DSA indexer's weights on one GPU beyond their 1/TP share of the parameters (:mod:`...indexer`).

    DeepSeek-V4: every weight vLLM keeps whole on each GPU (:meth:`...V4Attention.replicated_parameters`).

    The indexers are whole on every GPU, ``wk_weights_proj`` 16-bit whatever the checkpoint's quantisation;
    the parameter count spreads them over the GPUs at its dtype like every other weight.
    """
    arch, tp = request.architecture, request.tensor_parallel_size
    indexer = arch.indexer
    dtype = request.effective_weight_dtype
    element = weight_bytes_per_param(dtype if dtype != "mxfp4" else "bf16")
    if arch.v4 is not None:  # DeepSeek-V4's and V4.1's down-projections, compressors and indexers
        v4, hidden = arch.v4, arch.hidden_size
        replicated = sum(
            v4.replicated_parameters(hidden, 1) + v41_replicated_extras(v4, hidden, layer)
            if v4.v41
            else v4.replicated_parameters(hidden, ratio)
            for layer, ratio in enumerate(v4.ratios)
        )
        return round(replicated * element * (1 - 1 / tp))
    if indexer is None:
        return 0
    whole = indexer.bytes_per_gpu(arch.hidden_size, element)
    share = indexer.parameters(arch.hidden_size) * element / tp
    return round((whole - share) * len(indexer.layers))


def mla_absorbed_bytes(request: PlanRequest) -> int:
    """MLA's ``W_UK_T`` and ``W_UV`` on one GPU, beside ``kv_b_proj`` (see the module docstring); else 0."""
    arch = request.architecture
    mla = arch.mla
    if mla is None:
        return 0
    heads = max(1, arch.num_attention_heads // request.tensor_parallel_size)
    per_layer = mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    blocks = ATTENTION_BLOCKS if arch.longcat else 1  # LongCat-Flash: two MLA blocks a layer
    return arch.num_layers * blocks * per_layer * ACTIVATION_ELEMENT_BYTES


def embedding_bytes_per_gpu(request: PlanRequest) -> float:
    """One vocabulary x hidden matrix on one GPU as loaded (16-bit under quantisation), split by TP."""
    arch, dtype = request.architecture, request.effective_weight_dtype
    element = weight_bytes_per_param(dtype if dtype in FLOAT_DTYPES else "bf16")
    return arch.vocab_size * arch.hidden_size * element / request.tensor_parallel_size


def layer_weight_bytes(request: PlanRequest, loaded: int) -> float:
    """What of ``loaded`` the decoder layers (and a vision tower) hold: all but RoPE tables and embeddings."""
    matrices = 1 if request.architecture.tie_word_embeddings else 2
    return loaded - rope_cache_bytes(request) - embedding_bytes_per_gpu(request) * matrices


def cpu_offloaded_bytes(request: PlanRequest, layer_bytes: float) -> int:
    """Weights vLLM's ``--cpu-offload-gb`` keeps in CPU memory on one GPU: its layers', up to the budget.

    ``make_layers`` passes each decoder layer to the offloader, which moves parameters, in order, while
    fewer than ``cpu_offload_gb`` GiB are offloaded (``maybe_offload_to_cpu`` in
    ``vllm/model_executor/models/utils.py``, 0.10.0 and 0.20.0; ``UVAOffloader._maybe_offload_to_cpu``,
    ``model_executor/offloader/uva.py``, 0.32.0, which also takes a vision tower's): the embeddings and the
    LM head stay. The parameter that crosses the budget goes whole, so up to one weight matrix more than the
    budget leaves; not modelled.
    """
    return round(min(request.cpu_offload_bytes, max(0.0, layer_bytes)))


def estimate_activation_bytes(request: PlanRequest, *, samples: bool = True) -> int:
    """The profile's torch peak above the weights: an explicit figure, or the larger of its two passes.

    The forward pass of ``T`` tokens peaks inside one decoder layer's MLP; the sampler pass then holds
    ``R x vocab`` logits several times over. Both are freed between the passes, so the peak is the larger
    one, plus the workspaces the first forward allocates (the theory of operation gives the sources).
    ``samples=False``: a pipeline stage before the last, which runs the forward pass only.
    """
    if request.activation_bytes is not None:
        return request.activation_bytes
    tokens = request.effective_batch[0]
    arch, tp = request.architecture, request.tensor_parallel_size
    element = ACTIVATION_ELEMENT_BYTES
    if request.weight_dtype and normalise_dtype(request.weight_dtype) == "fp32":
        element = round(WEIGHT_DTYPES["fp32"])  # --dtype float32: activations and logits are float32 too
    forward = tokens * (2 * arch.hidden_size + 3 * _dense_mlp_width(arch) // tp) * element
    held = encoder_outputs_bytes(request, tokens, element)
    return profile_peak(request, forward, element, samples=samples) + held + moe_workspace_bytes(request)


def encoder_outputs_bytes(request: PlanRequest, tokens: int, element: int) -> int:
    """What a multimodal profile keeps of its encoder's dummy batch through the language model's passes.

    ``profile_run`` caches the encoder's outputs (``encoder_cache``) until both passes are done: at most the
    encoder budget's tokens, ``max_num_batched_tokens`` when an item fits in it, of the language model's
    width. ``None`` vision parameters (a tower not modelled) count as a tower.
    """
    if request.architecture.vision_parameters == 0:
        return 0
    return tokens * request.architecture.hidden_size * element


def hopper_or_blackwell(gpu_name: str) -> bool | None:
    """Whether a GPU, known here by name only, has compute capability 9.0-10.x; ``None`` when unknown.

    vLLM picks kernels and communicators by that capability: the MXFP4 MoE backend (below) and the
    tensor-parallel buffers of :meth:`~sidecar.budget.vllm_release.VllmRelease.non_torch_bytes`.
    """
    name = gpu_name.lower()
    if any(part in name for part in HOPPER_OR_BLACKWELL_NAMES):
        return True
    if any(part in name for part in OLDER_OR_WORKSTATION_NAMES):
        return False
    return None


def _runs_openai_triton_kernels(gpu_name: str) -> bool:
    """Whether vLLM runs MXFP4 experts with OpenAI's Triton kernels rather than Marlin on this GPU.

    ``get_mxfp4_backend`` takes them on compute capability 9.0 to 10.x ("only confirmed to work on SM90
    and SM100") and Marlin below (vllm-project/vllm@007d500 ``quantization/mxfp4.py``); the GPU is known
    here by name only, so Hopper and data-centre Blackwell names select them.
    """
    return hopper_or_blackwell(gpu_name) is True


def _dense_mlp_width(arch: Architecture) -> int:
    """The widest MLP the forward runs outside the MoE workspace.

    That is the model's own, or for a MoE model its dense layers (DeepSeek's first ones, Llama 4's
    interleaved ones) or its shared experts; the routed experts work in :func:`moe_workspace_bytes`.
    """
    moe = arch.moe
    if moe is None:
        return arch.intermediate_size
    dense = moe.moe_layer_count(arch.num_layers) < arch.num_layers
    return max(moe.shared_intermediate_size, dense_mlp_width(arch) if dense else 0)


def moe_workspace_bytes(request: PlanRequest) -> int:
    """The fused-MoE kernels' two scratch buffers for the profile's batch, which vLLM keeps after it.

    Per token and routed expert: ``max(I, H) + max(2I, H)`` elements for the Triton experts
    (``TritonExperts.workspace_shapes``), ``max(2I, H) + I`` for Marlin's MXFP4 experts
    (``MarlinExperts.workspace_shapes``) and ``I`` for OpenAI's Triton MXFP4 experts on Hopper and Blackwell
    (``OAITritonExperts.workspace_shapes``), with ``I`` the per-GPU expert size (padded for MXFP4), for
    every data-parallel rank's batch (:mod:`sidecar.budget.experts`); 0 for dense models.
    """
    arch, moe, placement = request.architecture, request.architecture.moe, request.experts
    if moe is None or placement is None:
        return 0
    tokens = request.effective_batch[0] * placement.gathered_batches  # every data-parallel rank's batch
    hidden = arch.hidden_size
    intermediate = math.ceil(moe.expert_intermediate_size / placement.width_shards)
    if request.effective_weight_dtype == "mxfp4":
        hidden, intermediate = _mxfp4_padded_sizes(
            arch.hidden_size, moe.expert_intermediate_size, placement.width_shards
        )
        if _runs_openai_triton_kernels(request.gpu):  # OAITritonExperts: one buffer of the activated output
            per_expert = intermediate
        else:
            per_expert = max(2 * intermediate, hidden) + intermediate
    else:
        per_expert = max(intermediate, hidden) + max(2 * intermediate, hidden)
    return tokens * moe.experts_per_token * per_expert * ACTIVATION_ELEMENT_BYTES
