"""Pipeline parallelism: the layers each stage holds, what its GPU must fit, and the stage that sets the pool.

Theory of operation
-------------------
With ``--pipeline-parallel-size P`` every stage is a GPU (or a TP group) of its own, with its own profile,
and the engine has one pool. Each rule below was read in vLLM 0.32.0 as installed and checked against the
calibration table's two llm-d rows (vLLM 0.19, Llama-3.1-8B on H100 at PP 2 and PP 4):

* **Layers per stage**: ``get_pp_indices`` (``vllm/distributed/utils.py``) gives each stage
  ``layers // P``; the remainder goes one each to the stages before the last, from the one before the last
  backwards (the last also holds the final norm and the LM head). ``VLLM_PP_LAYER_PARTITION`` overrides
  it; that is not modelled.
* **Weights per stage**: the first stage holds the token embeddings, the last the LM head; with tied
  embeddings the last stage holds a copy of the embedding matrix for it (``LlamaModel.__init__``:
  ``embed_tokens`` on the first rank, and on the last too when ``tie_word_embeddings``), so a tied model
  stores the matrix twice from ``P = 2``. The RoPE tables are whole on every stage. The rest (the decoder
  layers, a vision tower with them) is split in proportion to the stage's layers. Llama-3.1-8B logs 7.51
  GiB on stage 1 of 2 (this: 7.51) and 4.26 GiB on stage 1 of 4 (4.26).
* **Activation per stage**: every stage runs the profile's forward pass of ``max_num_batched_tokens``
  (its peak is inside one decoder layer, so it does not shrink with fewer layers); only the last stage
  samples (``_dummy_sampler_run`` runs on the last rank, ``gpu_model_runner.py``). Stage 1 of the
  llm-d rows logs a torch peak of 1.10 GiB (the forward) where the TP 1 run logs 1.89 (the sampler); this
  model's forward is 0.96, the stage's own output (hidden states and residual) probably being the rest.
* **One pool**: each worker sizes its KV cache from its own memory and its own layers, then every worker
  takes the smallest block count among them (``get_kv_cache_configs``, ``kv_cache_utils.py``: "Change the
  num_blocks of each rank to the smallest among all ranks"). A block on a stage holds that stage's layers.
  So the stage with the least memory per layer sets ``num_gpu_blocks``: the last one, with the sampler
  and the LM head, on the llm-d rows (67,207 and 141,079 blocks logged; this model: 67,184 and 141,024).
* A hybrid model's KV cache groups are made over the whole model and projected onto each worker; here a
  stage's block is taken to hold its share of a group's layers, rounded up, which is exact for one group
  and an approximation (said in the plan's notes) for several.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.budget.layer_kinds import LayerKind
from sidecar.budget.profile import (
    cpu_offloaded_bytes,
    embedding_bytes_per_gpu,
    estimate_activation_bytes,
    layer_weight_bytes,
    rope_cache_bytes,
)
from sidecar.budget.speculative import drafter_kv_layers

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest


def stage_layer_counts(num_layers: int, stages: int) -> tuple[int, ...]:
    """The decoder layers of each pipeline stage, as ``get_pp_indices`` partitions them."""
    per_stage = num_layers // stages
    counts = [per_stage] * stages
    for index in range(2, num_layers % stages + 2):
        counts[-index] += 1
    return tuple(counts)


@dataclass(frozen=True, slots=True)
class PipelineStage:
    """One stage's share of the model and of its profile (bytes per GPU)."""

    index: int  # 0-based
    layers: int  # decoder layers
    kv_layers: int  # of which hold KV
    weights: int
    activation: int
    pool_blocks: int = 0  # blocks its memory holds; the engine's pool is the smallest
    lora: int = 0  # LoRA adapter slots of its layers (:mod:`sidecar.budget.lora`)


def stage_block_bytes(
    group_block_bytes: float, layers_per_group: int, kv_layers: int, total_kv_layers: int
) -> int:
    """Bytes of one block on a stage with ``kv_layers`` of the model's ``total_kv_layers`` KV layers."""
    if not total_kv_layers:
        return 0
    return round(
        group_block_bytes / layers_per_group * math.ceil(layers_per_group * kv_layers / total_kv_layers)
    )


def pipeline_stages(
    request: PlanRequest,
    profile: dict[str, int],
    requested: int,
    group_block: float,
    per_group: int,
    *,
    loaded: int,
) -> tuple[PipelineStage, ...]:
    """Every stage's weights, activation and pool in blocks, from the whole model's profile terms.

    ``loaded``: the whole model's weights on one GPU as loaded, before any CPU offload.
    """
    arch = request.architecture
    embedding = embedding_bytes_per_gpu(request)  # one matrix
    rope = rope_cache_bytes(request)  # every stage holds all of it
    body = layer_weight_bytes(request, loaded)  # layers, vision: each stage offloads from its own share
    forward = estimate_activation_bytes(request, samples=False)
    own_kv = arch.kv_kinds[: len(arch.layer_kinds)]  # a KV-shared layer (Gemma 3n/4) holds none
    kv_layers = [kind is not LayerKind.NONE for kind in own_kv]
    drafter_kv = drafter_kv_layers(request)  # an MTP drafter's layers attend on the last stage
    counts = stage_layer_counts(len(kv_layers), request.pipeline_parallel_size)
    out: list[PipelineStage] = []
    start = 0
    for index, layers in enumerate(counts):
        first, last = index == 0, index == len(counts) - 1
        stage_kv = sum(kv_layers[start : start + layers]) + (drafter_kv if last else 0)
        start += layers
        share = body * layers / len(kv_layers)
        kept = share - cpu_offloaded_bytes(request, share)
        weights = rope + round(kept + embedding * (int(first) + int(last)))
        activation = profile["activation"] if last else forward  # only the last stage samples
        lora = round(profile.get("lora", 0) * layers / len(kv_layers))  # slots in proportion to the layers
        drafter = profile.get("drafter", 0) if last else 0  # an MTP drafter runs beside the LM head
        fixed = weights + activation + lora + drafter + profile["non_torch"] + profile["cuda_graphs"]
        fixed += profile.get("kept_free", 0)  # 0.34's margin (the whole model's activation sets it)
        memory = max(0, requested - fixed)
        block = stage_block_bytes(group_block, per_group, stage_kv, sum(kv_layers) + drafter_kv)
        blocks = int(memory // block) if block else 0
        out.append(PipelineStage(index, layers, stage_kv, weights, activation, blocks, lora=lora))
    return tuple(out)
