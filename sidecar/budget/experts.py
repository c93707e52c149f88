"""Where a MoE model's routed experts live when vLLM runs data-parallel engines or expert parallelism. Pure.

Theory of operation
-------------------
Attention, embeddings and the LM head are sharded over one engine's tensor-parallel group only; the routed
experts are not. ``FusedMoEParallelConfig.make`` (``vllm/model_executor/layers/fused_moe/config.py``, read
in 0.32.0) flattens the tensor-parallel group across the data-parallel ranks, so with
``--data-parallel-size D`` and ``--tensor-parallel-size T``:

* without ``--enable-expert-parallel`` every expert's intermediate width is split ``D x T`` ways ("There
  are 2 engine instances and the tensors are sharded across 4 devices");
* with it, every GPU holds whole experts, ``ceil(E / (D x T))`` of them on the most loaded rank
  (``determine_expert_map`` in ``fused_moe/expert_map_manager.py``: ``E // ep_size`` each, the remainder
  one more on the first ranks).

A data-parallel engine therefore holds far less than a whole model: gpt-oss-20b with ``--data-parallel-size
4`` on four L4s logs 438,932 KV tokens per engine (vLLM 0.29, the calibration table), five times what the
same GPU logs at TP 1.

The experts also see more tokens than one engine schedules: the default ``allgather_reducescatter``
backend (``ParallelConfig.all2all_backend``) gathers every data-parallel rank's tokens before the experts
run (``MoEPrepareAndFinalizeNaiveDPEPModular.prepare``, ``prepare_finalize/naive_dp_ep.py``), and the
fused-MoE workspaces are sized for that gathered batch (``_allocate_buffers`` takes the dispatched ``M``;
``modular_kernel.py``, 0.32.0). The profile runs every rank's dummy batch at once, so the workspace is
``D`` batches' worth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExpertPlacement:
    """How one GPU holds the routed experts of a MoE model."""

    width_shards: int  # ways each expert's intermediate width is split (1 with expert parallelism)
    experts_per_gpu: int  # whole experts one GPU holds (all of them without expert parallelism)
    gathered_batches: int  # data-parallel batches the experts see at once

    def share_of_experts(self, num_experts: int) -> float:
        """The fraction of the routed experts' parameters one GPU holds."""
        return self.experts_per_gpu / max(1, num_experts) / self.width_shards


def expert_placement(
    num_experts: int, tensor_parallel_size: int, data_parallel_size: int, *, expert_parallel: bool
) -> ExpertPlacement:
    """Where vLLM puts ``num_experts`` routed experts (the theory of operation gives the rules)."""
    ranks = tensor_parallel_size * data_parallel_size
    if expert_parallel and ranks > 1:
        return ExpertPlacement(1, math.ceil(num_experts / ranks), data_parallel_size)
    return ExpertPlacement(ranks, num_experts, data_parallel_size)
