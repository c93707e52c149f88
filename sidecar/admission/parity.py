"""Refuse exactly what the engine would refuse, before it reaches the engine, and nothing else. Pure.

Checked against vLLM 0.32.0's source and the real CPU server (``tests/e2e/test_engine_parity.py``
sends every case to both; the README's table lists them):

* ``max_tokens`` (or ``max_completion_tokens``) above ``max_model_len``: vLLM answers 400
  "max_tokens=N cannot be greater than max_model_len=M" whatever the prompt
  (``vllm/entrypoints/utils.py``, ``get_max_tokens``). Known from the body alone: no tokenizing.
* A prompt of ``max_model_len`` tokens or more: 400; at exactly ``max_model_len`` there is no room
  for one output token ("max_tokens must be at least 1, got 0"), above it "your prompt contains N
  input tokens" (``vllm/entrypoints/renderer.py`` / ``serving_engine.py``, ``_validate_input``).
  Refused here only on vLLM's own count (``/tokenize``, asked first: :mod:`sidecar.admission.recount`),
  or on an exact count (token ids, or the model's tokenizer and template) when vLLM could not be asked
  and the answers on its route have not shown a count vLLM disagrees with: an estimate never causes a
  400. Each prompt of a batch is checked on its own.
* With ``truncate_prompt_tokens`` vLLM truncates a long prompt instead of refusing it: no refusal here.
  ``/v1/responses`` asks for it with ``truncation`` other than ``"disabled"`` (``build_tok_params`` in
  ``entrypoints/openai/responses/protocol.py``): with ``max_output_tokens`` the real 0.32 server serves a
  1,600-token input on a 1,024-token model, keeping 1,023; without it 0.32 still answers 400 (0.33 serves
  it), which comes back from vLLM itself.
* ``prompt + max_tokens`` above ``max_model_len`` is *served*: vLLM shortens the output to the room
  left (``get_max_tokens`` takes the minimum). The sidecar forwards it, its reservation capped at
  ``max_model_len``.
"""

from __future__ import annotations

from sidecar.admission.body import RequestFacts
from sidecar.admission.outcomes import Reason, RefusedError


def engine_refusal(
    facts: RequestFacts, max_model_len: int | None, *, counts_trusted: bool = True
) -> RefusedError | None:
    """The 400 vLLM would answer ``facts`` with, or ``None`` when it would serve it.

    ``counts_trusted``: whether exact counts on the request's route still agree with vLLM's usage
    (:mod:`sidecar.admission.count_audit`); when not, a long prompt is left to vLLM unless vLLM counted
    it (``facts.engine_counted``).
    """
    if max_model_len is None:
        return None
    if facts.max_output_tokens is not None and facts.max_output_tokens > max_model_len:
        return RefusedError(
            Reason.CONTEXT_LENGTH_EXCEEDED,
            f"max_tokens={facts.max_output_tokens} cannot be greater than max_model_len={max_model_len}: "
            "request fewer output tokens",
            param="max_tokens",
        )
    # with truncate_prompt_tokens vLLM truncates instead of refusing
    counted = facts.engine_counted or (facts.exact and counts_trusted)
    if counted and facts.truncate_prompt_tokens is None:
        for index, prompt in enumerate(facts.prompts):
            if prompt >= max_model_len:
                which = f"prompt {index} of the batch" if len(facts.prompts) > 1 else "the prompt"
                return RefusedError(
                    Reason.CONTEXT_LENGTH_EXCEEDED,
                    f"the model's context length is {max_model_len} tokens and {which} has {prompt}, "
                    "leaving no room for output: shorten the prompt",
                    param="prompt",
                )
    return None
