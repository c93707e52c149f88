"""The start-up profile's sampler stage and what it leaves behind, per GPU model runner.

Theory of operation
-------------------
After its dummy forward (:mod:`sidecar.budget.profile`), vLLM's ``profile_run`` samples one row per dummy
request on the last pipeline stage (``_dummy_sampler_run``): ``R = min(max_num_seqs, T)`` rows of logits over
the vocabulary ``V``, while the forward's ``T x hidden`` output stays alive. The forward's intermediates are
freed by then, so the profile's torch peak is the larger of the two stages. What the sampler stage holds,
and what the runner keeps for good, depends on which runner samples (:mod:`sidecar.budget.model_runner`):

**V1** (``v1/worker/gpu_model_runner.py``): the dummy batch sets top-k and top-p, so ``Sampler.forward``
makes a float32 copy of the 16-bit logits and ``TopKTopPSampler`` holds the probabilities and the
exponential noise: ``R x V x (2 + 3 x 4)`` bytes (``random_sample``, read in 0.32.0). Where the filter
sorts the vocabulary (PyTorch's ``apply_top_k_top_p``: 0.11.1-0.16.x, and earlier releases without
FlashInfer; :meth:`~sidecar.budget.vllm_release.VllmRelease.sampler_sorts_vocabulary`) the sort is the
peak: ``R x V x (2 + 4 + 32)``. Qwen3-14B on an H100 logs a torch peak of 5.64 GiB with vLLM 0.15/0.16 and
2.23 GiB with 0.17/0.18 (llm-d-planner's version sweep): 37.7 and 14.2 bytes a logit beside the workspace.
With speculative decoding the profile then runs the rejection sampler (``RejectionSampler.forward``, read in
0.12.0, 0.15.0, 0.20.0 and 0.32.0): ``2R`` fresh rows, a float32 copy of the ``R`` bonus rows, the target
rows in float32, their clone, their probabilities and the recovered tokens' noise, ``R x V x (3 x 2 + 5 x 4)``
at its peak (26 bytes against 14; 22 in 0.12-0.14; before 0.12 below the plain pass). The dummy pass drafts
one token whatever ``num_speculative_tokens`` is (PR #37521 proposed ``k``; closed). The real CPU engine
measures the 12-byte increment exactly (``tests/e2e/test_rejection_profile.py``). Beside the larger stage V1
keeps :data:`PROFILE_WORKSPACE_BYTES`, measured on every V1 profile of the calibration table; it is about
what the source keeps: the ``T x hidden`` ``inputs_embeds`` buffer it allocates even for text models, the
forward's output held through sampling, and the Triton top-k/top-p kernel's per-SM buffer of ``SMs x V x 4``
made in the profile (``topk_topp_triton.py``), 0.19 GiB for Llama-3.1-8B on an H100.

**V2** (``v1/worker/gpu/model_runner.py``, read in 0.29.0 and 0.32.0): a dummy request slot never had
``add_request``, so no slot needs logits processing, top-k and top-p are off and ``gumbel_sample`` takes a
per-block argmax of the 16-bit logits ("the sampler may skip top_k, top_p, and logprobs", its comment): the
stage holds the forward's output, the sampled rows' hidden states and ``R x V x 2`` logits (plus
``12 R x cdiv(V, 1024)`` bytes of scratch). 0.34.0 adds a pass with ``SamplingParams.for_sampler_warmup``
(float32 logits, top-k/top-p filtering, probabilities: 14 bytes a logit, as V1's). The rejection sampler is
not run in the profile. V2 keeps, from ``load_model`` on, per request slot: ``PenaltiesState``'s output
counts, ``R x V x 4`` ("rarely used but can be very large, taking up GBs", its comment), the prompt mask and
the structured-output bitmask, ``R x cdiv(V, 32) x 4`` each (the bitmask ``q = 1 + k`` times with ``k``
speculative tokens), and :data:`V2_REQUEST_TABLE_BYTES` of fixed tables (``gpu/sample/penalties.py``,
``gpu/structured_outputs.py``, ``logit_bias.py``, ``bad_words.py``, ``logprob.py``). Real boots on the V2
runner, compared in ``tests/data/vllm-startup-logs/FINDINGS.md``: Qwen2.5-1.5B-Instruct eager on an RTX 4070
Laptop GPU with vLLM 0.30.0 leaves 0.41 GiB beside its weights, where V1's terms take 0.94 and these 0.53.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from sidecar.budget.model_runner import ModelRunner
from sidecar.units import MIB

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

LOGIT_ELEMENT_BYTES: Final = 4
"""The sampler works in float32."""
SAMPLER_SORT_BYTES: Final = 32
"""Bytes per logit that sorting the float32 logits holds beside them and the model's 16-bit logits
(``logits.sort`` in ``apply_top_k_top_p``, vLLM 0.10-0.16): the sorted values (4) and their int64 indices
(8), and, as torch's segmented radix sort works on rows this long, the int64 positions it sorts as values
(8) and its alternate key and value buffers (4 + 8). The sum, 38 bytes a logit with the other two, is what
the logs show: Qwen3-14B's 5.64 GiB torch peak on vLLM 0.15/0.16 is 37.7 bytes per logit beside the
profile workspace."""
SAMPLER_FLOAT32_COPIES: Final = 3
"""float32 tensors of ``R x vocab`` the sampler holds at once beside the model's logits: the float32 logits,
the probabilities and the exponential noise (``Sampler.forward``, ``TopKTopPSampler``, vLLM 0.10-0.32)."""
PROFILE_WORKSPACE_BYTES: Final = 184 * MIB
"""What every V1 profile on the calibration table shows beside its larger pass (0.18 GiB, +-0.01 on the six
models whose sampler pass dominates): workspaces the first forward allocates and keeps, and the forward's
hidden states, alive while the sampler runs. Measured, not read in source."""
V2_REQUEST_TABLE_BYTES: Final = 17_924
"""V2's fixed per-slot sampler tables: logit bias and allowed tokens (3 x 1,024 int32 and 128 stop tokens),
bad words (1,024 tokens, 129 offsets) and logprob token ids (128), read in 0.29.0 and 0.32.0."""
GUMBEL_BLOCK: Final = 1024
"""``gumbel_sample`` keeps an int64 argmax and a float32 maximum per row and block of this many logits."""
BITMASK_BITS: Final = 32


def profile_peak(request: PlanRequest, forward: int, element: int, *, samples: bool) -> int:
    """The profile's torch peak from the forward and sampler stages, and what the runner keeps beside it.

    ``forward`` is the dummy forward's peak; ``samples=False`` is a pipeline stage before the last, which
    runs no sampler. The experts' workspaces and a multimodal encoder's outputs come on top
    (:func:`sidecar.budget.profile.estimate_activation_bytes`).
    """
    if request.effective_model_runner is ModelRunner.V1:
        return max(forward, _v1_sampler_stage(request, element) if samples else 0) + PROFILE_WORKSPACE_BYTES
    tokens, seqs = request.effective_batch
    rows, arch = min(seqs, tokens), request.architecture
    if not samples:
        return forward
    hidden = (tokens + rows) * arch.hidden_size * element  # the forward's output and the sampled rows
    logits = rows * arch.vocab_size * element + 12 * rows * math.ceil(arch.vocab_size / GUMBEL_BLOCK)
    if request.release.at_least(34):  # the warm-up pass: float32 logits, filtered logits, probabilities
        logits = rows * arch.vocab_size * (element + SAMPLER_FLOAT32_COPIES * LOGIT_ELEMENT_BYTES)
    return max(forward, hidden + logits) + v2_sampler_state_bytes(request)


def resident_sampler_bytes(request: PlanRequest) -> int:
    """What of the activation figure the runner keeps after the profile (V2's sampler state)."""
    if request.activation_bytes is not None or request.effective_model_runner is ModelRunner.V1:
        return 0
    return v2_sampler_state_bytes(request)


def v2_sampler_state_bytes(request: PlanRequest) -> int:
    """What V2's sampler keeps per request slot from ``load_model`` on: penalties, bitmasks, fixed tables."""
    slots, vocab = request.effective_batch[1], request.architecture.vocab_size
    speculative = request.speculative.num_speculative_tokens if request.speculative is not None else 0
    masks = 1 + (1 + speculative)  # the prompt mask, and the grammar bitmask per query token
    packed = math.ceil(vocab / BITMASK_BITS) * 4
    return slots * (vocab * 4 + masks * packed + V2_REQUEST_TABLE_BYTES)


def _v1_sampler_stage(request: PlanRequest, element: int) -> int:
    """V1's sampler stage: the plain pass, the sort where it sorts, the rejection pass where it drafts."""
    tokens, seqs = request.effective_batch
    rows, vocab = min(seqs, tokens), request.architecture.vocab_size
    copies = SAMPLER_FLOAT32_COPIES * LOGIT_ELEMENT_BYTES
    if request.release.sampler_sorts_vocabulary(rows=rows, flashinfer_sampler=request.flashinfer_sampler):
        copies = LOGIT_ELEMENT_BYTES + SAMPLER_SORT_BYTES  # the sort is the pass's peak
    sampler = rows * vocab * (element + copies)
    rejection = request.release.rejection_pass_float32_copies() if request.speculative else 0
    if rejection:  # 2R rows of logits, a copy of the R bonus rows, the float32 tensors
        sampler = max(sampler, rows * vocab * (3 * element + rejection * LOGIT_ELEMENT_BYTES))
    return sampler
