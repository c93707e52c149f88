"""Settings vLLM refuses to start with: the planner refuses them too, in one line that says what to change.

* ``verify_with_parallel_config`` (``vllm/config/model.py``, 0.8 to 0.32 alike): the attention heads must
  divide by the TP size (KV heads need not: they are replicated).
* ``_get_and_verify_max_len`` (same file): ``--max-model-len`` above the length the config derives is refused
  unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``.
* A pipeline stage needs at least one layer (``get_pp_indices``, ``vllm/distributed/utils.py``).
* ``--enable-lora`` on a model class without LoRA support, with an LM head adapter over too large a
  vocabulary, or a fully sharded rank that the TP size does not divide
  (:func:`sidecar.budget.lora.check_lora`).
* A packed ``--kv-cache-dtype`` the release lacks, one on an MLA model, or TurboQuant on a state hybrid
  before 0.22 (:func:`sidecar.budget.kv_formats.check_kv_format`).
* From 0.33, an explicit 16-bit ``--kv-cache-dtype`` other than the model's dtype (``VllmConfig.
  _reject_mismatched_float_kv_cache``, ``config/vllm.py``, 0.33.0 and 0.34.0).
* An EAGLE-3 drafter on a model class that does not hand it hidden states
  (:func:`sidecar.budget.speculative.check_speculative`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sidecar.budget.dtypes import normalise_dtype
from sidecar.budget.kv_formats import check_kv_format, model_kv_dtype
from sidecar.budget.lora import check_lora
from sidecar.budget.speculative import check_speculative
from sidecar.errors import UsageError

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

_DIVISORS = (1, 2, 4, 8, 16)


def check_as_vllm_does(request: PlanRequest) -> None:
    """Raise :class:`UsageError` for a deployment vLLM would refuse to start."""
    arch, tp = request.architecture, request.tensor_parallel_size
    if arch.num_attention_heads % tp:
        fits = [n for n in _DIVISORS if arch.num_attention_heads % n == 0]
        raise UsageError(
            f"vLLM refuses --tensor-parallel-size {tp}: the model's {arch.num_attention_heads} attention "
            f"heads must divide by it; use {', '.join(map(str, fits))}"
        )
    if request.pipeline_parallel_size > arch.num_layers:
        raise UsageError(
            f"--pipeline-parallel-size {request.pipeline_parallel_size} leaves a stage without layers: "
            f"the model has {arch.num_layers}"
        )
    derived, wanted = arch.derived_max_model_len, request.max_model_len
    if wanted and derived and wanted > derived and not request.allow_long_max_model_len:
        raise UsageError(
            f"vLLM refuses --max-model-len {wanted}: the model's config derives {derived:,} "
            "(max_position_embeddings, RoPE scaling); lower it, or set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
            "for vLLM and the sidecar"
        )
    if request.lora is not None:
        check_lora(arch, request.lora, tp)
    check_speculative(request)
    check_kv_format(request)
    _check_float_kv(request)


FLOAT_KV_MATCH_SINCE = 33
"""From 0.33.0 an explicit 16-bit KV dtype must be the model's (``_reject_mismatched_float_kv_cache``)."""


def _check_float_kv(request: PlanRequest) -> None:
    """Refuse ``--kv-cache-dtype float16`` on a bfloat16 model and the reverse, as vLLM 0.33+ does."""
    kv = normalise_dtype(request.kv_cache_dtype)
    if kv not in {"bf16", "fp16"} or not request.release.at_least(FLOAT_KV_MATCH_SINCE):
        return
    model = model_kv_dtype(request)
    if kv != model:
        names = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
        raise UsageError(
            f"vLLM {request.release} refuses --kv-cache-dtype {names[kv]} with a {names.get(model, model)} "
            "model: use auto (or fp8)"
        )
