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

Other drafters (EAGLE, EAGLE-3, a separate draft model, Medusa...) bring a model of their own; they are
accepted and said to be not modelled in the plan's notes, not refused: vLLM serves them. So is ``mtp`` for a
config that names no MTP layers (vLLM assumes one for some families and refuses others; the plan cannot
tell which without the checkpoint's layout).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sidecar.budget.parameters import layer_parameter_count
from sidecar.budget.profile import ACTIVATION_ELEMENT_BYTES, layer_weight_bytes, mla_absorbed_bytes
from sidecar.errors import UsageError

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

DRAFTLESS_METHODS: Final = frozenset({"ngram", "suffix", "ngram_gpu"})
"""Methods whose drafts come from the text itself: no drafter in GPU memory."""
MTP_METHODS: Final = frozenset({"mtp", "deepseek_mtp"})
"""Multi-token prediction from the checkpoint's own extra layers."""
MTP_NORMS: Final = 3  # enorm, hnorm and the shared head's norm


@dataclass(frozen=True, slots=True)
class SpeculativeSettings:
    """vLLM's ``--speculative-config``, as far as memory goes."""

    method: str
    num_speculative_tokens: int = 1

    @classmethod
    def parse(cls, text: str) -> SpeculativeSettings:
        """VLLM's JSON spelling: ``{"method": "mtp", "num_speculative_tokens": 1, ...}``."""
        try:
            config: Any = json.loads(text)
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise UsageError(f"--speculative-config must be a JSON object, as vLLM takes it: got {text!r}")
        method = config.get("method")
        tokens = config.get("num_speculative_tokens", 1)
        if not isinstance(method, str) or not method:
            raise UsageError('--speculative-config needs a "method": ngram, mtp, eagle, eagle3...')
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise UsageError(f'--speculative-config "num_speculative_tokens" must be above 0: {tokens!r}')
        return cls(method=method.strip().lower(), num_speculative_tokens=tokens)

    @property
    def multi_token_prediction(self) -> bool:
        """Whether the drafter is the checkpoint's own MTP layers."""
        return self.method in MTP_METHODS

    @property
    def modelled(self) -> bool:
        """Whether the plan accounts for this drafter's memory (none, or MTP layers)."""
        return self.method in DRAFTLESS_METHODS or self.multi_token_prediction


def drafter_kv_layers(request: PlanRequest) -> int:
    """Attention layers the drafter adds to every token's KV (MTP: one per MTP layer)."""
    spec = request.speculative
    return request.architecture.draft_layers if spec is not None and spec.multi_token_prediction else 0


def drafter_weight_bytes(request: PlanRequest, loaded: int, body_parameters: int) -> int:
    """The drafter's own weights on one GPU (0 for a draftless or unmodelled method).

    ``loaded`` is the model's weights on one GPU as loaded; ``body_parameters`` the parameters of its decoder
    layers: their ratio is what one layer's parameter costs there (dtype, TP and expert placement included).
    """
    arch = request.architecture
    layers = drafter_kv_layers(request)
    if not layers or body_parameters <= 0:
        return 0
    absorbed = mla_absorbed_bytes(request)  # MLA's decode copies: each MTP layer has its own too
    per_parameter = (layer_weight_bytes(request, loaded) - absorbed) / body_parameters
    block = sum(layer_parameter_count(arch, arch.num_layers + i) for i in range(layers)) * per_parameter
    block += layers * absorbed / arch.num_layers
    hidden = arch.hidden_size
    unsplit = layers * (2 * hidden * hidden + MTP_NORMS * hidden) * ACTIVATION_ELEMENT_BYTES
    return round(block + unsplit)
