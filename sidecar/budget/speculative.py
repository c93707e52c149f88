"""Speculative decoding: what a drafter adds to the GPU beside the target model.

Theory of operation
-------------------
``--speculative-config`` names a method. **Draftless** methods (``ngram``, ``suffix``) look up drafts in the
prompt and output: no weights, no KV cache. **Multi-token prediction** (``mtp``, which vLLM 0.32 also
accepts as ``deepseek_mtp``) runs the layers a DeepSeek-V3/R1 or GLM-4.5 checkpoint ships beside the model
(``num_nextn_predict_layers`` of them; :mod:`sidecar.budget.safetensors` leaves them out of the model's own
count). Each is, in vLLM 0.32.0 (``DeepSeekMultiTokenPredictorLayer``,
``vllm/model_executor/models/deepseek_mtp.py``), a decoder layer of the model's own kind at index
``num_hidden_layers`` (its attention, and a MoE block where the model has one there), split over the GPUs as
the model's layers are, plus ``eh_proj``, a ``2H -> H`` linear that is not split (``nn.Linear``), and three
norms; its token embeddings and LM head are the target's when their weights are the same
(``_maybe_share_embeddings`` / ``_maybe_share_lm_head``, ``v1/spec_decode/llm_base_proposer.py``), as the
published checkpoints' copies are. Its attention layers take KV blocks from the same pool as the model's
(the KV cache spec collects every attention layer of the forward context, the drafter's included), so every
token costs ``num_nextn_predict_layers`` layers more; the pool is that much fewer tokens. Checked on the
real CPU engine with a tiny DeepSeek-V3 and one MTP layer (``tests/e2e/test_mtp_drafter.py``): the drafter's
own parameters and the engine's KV layers and blocks are what this module says.

Drafters with a model of their own (``eagle``, ``eagle3``, ``draft_model``; ``"model"`` in the JSON) are
sized by :mod:`sidecar.budget.drafters` from the drafter's ``config.json``, which the CLI resolves as it
resolves ``--model`` (:func:`sidecar.budget.catalog.resolve_drafter`). The method is inferred as vLLM 0.32.0
infers it (``SpeculativeConfig.__post_init__``, ``vllm/config/speculative.py``): none given means
``draft_model``, unless the model's name contains ``eagle-`` (EAGLE) or ``eagle3`` (EAGLE-3). A drafter whose
config cannot be read, or whose class is not modelled (Medusa, MLP speculators, DFlash...), is accepted and
said to be not modelled in the plan's notes, not refused: vLLM serves it. So is ``mtp`` for a config that
names no MTP layers (vLLM assumes one for some families and refuses others; the plan cannot tell which
without the checkpoint's layout).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from sidecar.budget.drafters import Drafter, drafter_layer_kinds, eagle_weight_bytes
from sidecar.budget.dtypes import FLOAT_DTYPES, weight_bytes_per_param
from sidecar.budget.layer_kinds import LayerKind
from sidecar.budget.parameters import layer_parameter_count, parameter_count
from sidecar.budget.profile import (
    ACTIVATION_ELEMENT_BYTES,
    layer_weight_bytes,
    loaded_weights_per_gpu,
    mla_absorbed_bytes,
    rope_cache_bytes,
)
from sidecar.budget.vllm_classes import serves_eagle3, vllm_class_table_version
from sidecar.errors import UsageError

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

DRAFTLESS_METHODS: Final = frozenset({"ngram", "suffix", "ngram_gpu"})
"""Methods whose drafts come from the text itself: no drafter in GPU memory."""
MTP_METHODS: Final = frozenset({"mtp", "deepseek_mtp"})
"""Multi-token prediction from the checkpoint's own extra layers."""
MTP_NORMS: Final = 3  # enorm, hnorm and the shared head's norm
NAMED_METHODS: Final = frozenset({"eagle", "eagle3", "dflash", "dspark"})
"""Methods vLLM keeps as given; any other with a model is inferred from the model's name."""


def infer_method(method: str | None, model: str | None) -> str:
    """The method vLLM 0.32.0 runs (``SpeculativeConfig.__post_init__``): explicit, or read off the model."""
    if method is None:
        method = "ngram" if model in {"ngram", "[ngram]"} else "draft_model"
    if model is None or method in NAMED_METHODS or method in DRAFTLESS_METHODS:
        return method
    name = model.lower()
    if "eagle-" in name:
        return "eagle"
    if "eagle3" in name:
        return "eagle3"
    if "dflash" in name:
        return "dflash"
    return method


@dataclass(frozen=True, slots=True)
class SpeculativeSettings:
    """vLLM's ``--speculative-config``, as far as memory goes."""

    method: str
    num_speculative_tokens: int = 1
    model: str | None = None  # the drafter's model: a directory, a config.json or a Hugging Face id
    drafter: Drafter | None = None  # its config once read (:func:`sidecar.budget.catalog.resolve_drafter`)
    drafter_problem: str | None = None  # why it could not be read

    @classmethod
    def parse(cls, text: str) -> SpeculativeSettings:
        """VLLM's JSON spelling: ``{"method": "eagle3", "model": "...", "num_speculative_tokens": 3}``."""
        try:
            config: Any = json.loads(text)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise UsageError(f"--speculative-config must be a JSON object, as vLLM takes it: got {text!r}")
        method, model = config.get("method"), config.get("model")
        tokens = config.get("num_speculative_tokens", 1)
        if method is not None and (not isinstance(method, str) or not method.strip()):
            raise UsageError(f'--speculative-config "method" must be a name (ngram, mtp, eagle3): {method!r}')
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise UsageError(f'--speculative-config "model" must be a path or a Hugging Face id: {model!r}')
        if method is None and model is None:
            raise UsageError('--speculative-config needs a "method" (ngram, mtp...) or a drafter "model"')
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise UsageError(f'--speculative-config "num_speculative_tokens" must be above 0: {tokens!r}')
        model = model.strip() if model else None
        method = infer_method(method.strip().lower() if method else None, model)
        return cls(method=method, num_speculative_tokens=tokens, model=model)

    def with_drafter(self, drafter: Drafter | None, problem: str | None = None) -> SpeculativeSettings:
        """A copy that knows the drafter's config (or why it could not be read)."""
        method = self.method
        model_type = drafter.architecture.model_type if drafter else None
        if method == "draft_model" and model_type in {"medusa", "mlp_speculator"}:
            method = model_type  # vLLM reads these off the drafter's config
        return replace(self, method=method, drafter=drafter, drafter_problem=problem)

    @property
    def multi_token_prediction(self) -> bool:
        """Whether the drafter is the checkpoint's own MTP layers."""
        return self.method in MTP_METHODS

    @property
    def own_model(self) -> bool:
        """Whether the drafter is a model of its own that the plan sizes (EAGLE, EAGLE-3, a draft model)."""
        return self.drafter is not None and self.drafter.modelled(self.method)

    @property
    def modelled(self) -> bool:
        """Whether the plan accounts for this drafter's memory (none, MTP layers, or a sized model)."""
        return self.method in DRAFTLESS_METHODS or self.multi_token_prediction or self.own_model


def check_speculative(request: PlanRequest) -> None:
    """Refuse what vLLM refuses to start with: an EAGLE-3 head on a model that cannot feed it.

    An EAGLE-3 head reads the target's auxiliary hidden states unless its config says
    ``eagle_config.use_aux_hidden_state: false``; vLLM stops at start-up when the target's class does not
    provide them ("Model does not support EAGLE3 interface", ``_setup_eagle3_aux_hidden_state_outputs`` in
    ``v1/worker/gpu_model_runner.py``, 0.32.0; which classes do is read from its registry).
    """
    spec, arch = request.speculative, request.architecture
    if (
        spec is None
        or spec.method != "eagle3"
        or (spec.drafter is not None and not spec.drafter.aux_hidden_states)
    ):
        return
    if serves_eagle3(arch.class_name) is False:
        raise UsageError(
            f"vLLM refuses an EAGLE-3 drafter for {arch.class_name}: the class does not hand a drafter its "
            f"hidden states (SupportsEagle3, vLLM {vllm_class_table_version()}); use an EAGLE or draft-model "
            "drafter, ngram, or no speculative decoding"
        )


def _own_drafter(request: PlanRequest) -> Drafter | None:
    """The drafter model the plan sizes (EAGLE, EAGLE-3, a draft model), if any."""
    spec = request.speculative
    return spec.drafter if spec is not None and spec.own_model else None


def _drafter_kinds(request: PlanRequest) -> tuple[LayerKind, ...]:
    drafter, spec = _own_drafter(request), request.speculative
    return drafter_layer_kinds(drafter, spec.method) if drafter is not None and spec is not None else ()


def _same_page(request: PlanRequest, drafter: Drafter) -> bool:
    arch, tp = request.architecture, request.tensor_parallel_size
    own = drafter.architecture.kv_elements_per_token_per_layer(tp)
    return own == arch.kv_elements_per_token_per_layer(tp)


def drafter_kv_layers(request: PlanRequest) -> int:
    """Drafter attention layers whose KV pages are the target's: MTP layers, or an own model's alike."""
    spec, drafter, kinds = request.speculative, _own_drafter(request), _drafter_kinds(request)
    if spec is not None and spec.multi_token_prediction:
        return request.architecture.draft_layers
    if drafter is None or set(kinds) != {LayerKind.FULL}:
        return 0
    return len(kinds) if _same_page(request, drafter) else 0


def drafter_extra_kv_elements(request: PlanRequest) -> int:
    """Per token, the KV elements of drafter layers shaped unlike the target's, where vLLM 0.32 adds them.

    That is one group of full-attention layers with pages of different sizes (``UniformTypeKVCacheSpecs``):
    only when the target's layers all attend in full and there is one pipeline stage; else 0 (not modelled).
    """
    drafter, kinds = _own_drafter(request), _drafter_kinds(request)
    target = set(request.architecture.kv_kinds) - {LayerKind.NONE}
    if drafter is None or set(kinds) != {LayerKind.FULL} or target != {LayerKind.FULL}:
        return 0
    if _same_page(request, drafter) or request.pipeline_parallel_size > 1:
        return 0
    return len(kinds) * drafter.architecture.kv_elements_per_token_per_layer(request.tensor_parallel_size)


def drafter_extra_kv_bytes(request: PlanRequest, per_layer: float) -> float:
    """:func:`drafter_extra_kv_elements` in bytes, given the target's ``per_layer`` bytes per token."""
    elements = request.architecture.kv_elements_per_token_per_layer(request.tensor_parallel_size)
    return drafter_extra_kv_elements(request) * per_layer / elements if elements else 0.0


def drafter_kv_modelled(request: PlanRequest) -> bool:
    """Whether every drafter attention layer's KV is in the plan (as more layers, or as extra elements)."""
    kinds = _drafter_kinds(request)
    return not kinds or bool(drafter_kv_layers(request) or drafter_extra_kv_elements(request))


def _own_model_weight_bytes(request: PlanRequest, spec: SpeculativeSettings, drafter: Drafter) -> int:
    if spec.method != "draft_model":
        dtype = request.effective_weight_dtype
        element = round(weight_bytes_per_param(dtype if dtype in FLOAT_DTYPES else "bf16"))
        return eagle_weight_bytes(request, drafter, spec.method, element)
    arch = drafter.architecture  # a whole model, loaded as the target is: its quantisation, the same TP
    try:  # at its own length: vLLM caps a draft model's at the shorter of the two
        alone = replace(
            request, architecture=arch, weight_dtype=None, speculative=None, lora=None, max_model_len=None
        )
    except UsageError as exc:  # what vLLM refuses for a model (TP that splits no heads...) it refuses here
        raise UsageError(f"the draft model {spec.model}: {exc}") from None
    shared = rope_cache_bytes(alone) if arch.rope_key == request.architecture.rope_key else 0  # one table
    return loaded_weights_per_gpu(alone, parameter_count(arch)) - shared


def drafter_weight_bytes(request: PlanRequest, loaded: int, body_parameters: int) -> int:
    """The drafter's own weights on one GPU (0 for a draftless or unmodelled method).

    ``loaded`` is the model's weights on one GPU as loaded; ``body_parameters`` the parameters of its decoder
    layers: their ratio is what one layer's parameter costs there (dtype, TP and expert placement included).
    """
    arch, spec, drafter = request.architecture, request.speculative, _own_drafter(request)
    if drafter is not None and spec is not None:
        return _own_model_weight_bytes(request, spec, drafter)
    layers = drafter_kv_layers(request)
    if not layers or body_parameters <= 0 or spec is None or not spec.multi_token_prediction:
        return 0
    absorbed = mla_absorbed_bytes(request)  # MLA's decode copies: each MTP layer has its own too
    per_parameter = (layer_weight_bytes(request, loaded) - absorbed) / body_parameters
    block = sum(layer_parameter_count(arch, arch.num_layers + i) for i in range(layers)) * per_parameter
    block += layers * absorbed / arch.num_layers
    hidden = arch.hidden_size
    unsplit = layers * (2 * hidden * hidden + MTP_NORMS * hidden) * ACTIVATION_ELEMENT_BYTES
    return round(block + unsplit)
