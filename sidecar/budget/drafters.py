"""Drafters with a model of their own (EAGLE, EAGLE-3, a separate draft model): their weights and KV layers.

Theory of operation
-------------------
With ``--speculative-config '{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}'`` vLLM
loads a second, small model beside the target on every GPU of the last pipeline stage, and the drafter's
attention layers take blocks from the same KV pool as the target's. What it costs follows from the
drafter's ``config.json`` (:class:`Drafter`) and from the classes vLLM 0.32.0 builds for it, read in its
source (``vllm/model_executor/models/llama_eagle3.py``, ``qwen3_eagle3.py``, ``llama_eagle.py``,
``v1/spec_decode/llm_base_proposer.py``, ``draft_model.py``, ``transformers_utils/configs/eagle.py``):

* **EAGLE-3** (``Eagle3LlamaForCausalLM``, ``Eagle3Qwen3ForCausalLM``): ``num_hidden_layers`` decoder layers
  of the drafter's own shape (split over TP as the model's are), the first one's QKV projection reading
  ``2 x hidden`` (the token embedding beside the target's hidden state), each with a third norm
  (``hidden_norm``); an ``fc`` projection of ``aux x target_hidden -> hidden`` that is not split
  (``ReplicatedLinear``; ``aux`` is ``num_aux_hidden_states``, else the length of
  ``eagle_aux_hidden_state_layer_ids``, else 3; none when ``eagle_config.use_aux_hidden_state`` is false),
  with the optional ``input_norm`` / ``fc_norm`` norms; a final norm; an LM head of its own over
  ``draft_vocab_size`` rows (split over TP), and, when that vocabulary is not the target's, the
  ``draft_id_to_target_id`` map (one int64 per draft token). Its token embeddings are the target's
  (``_maybe_share_embeddings``: a checkpoint that ships none, or the same ones, shares them) unless its
  hidden size differs.
* **EAGLE** (``EagleLlamaForCausalLM``): the drafter's decoder layers (the first without its
  ``input_layernorm``), an ``fc`` of ``2 x hidden -> hidden`` not split, no final norm, no LM head (the
  target's is used), the target's embeddings as above (published checkpoints ship a copy, which vLLM
  compares and shares).
* **A draft model** (``draft_model``, or no method and a model whose name names no EAGLE): a whole model,
  loaded as the target's weights are (its own quantisation, the target's dtype and TP, which vLLM requires
  to be the same), and never sharing embeddings or LM head (``DraftModelProposer``). Its RoPE table is the
  target's when their RoPE settings are the same (``get_rope`` caches tables by them, ``_ROPE_DICT`` in
  ``rotary_embedding/__init__.py``), else its own.

KV: the drafter's layers attend with their own head count and size. When their page equals the target's
layers', they are more layers of the same group (as an MTP layer is); when it does not and the target has
only full-attention layers, vLLM 0.32 puts all of them in one group whose block is the sum of every
layer's page (``UniformTypeKVCacheSpecs``, ``get_kv_cache_groups`` in ``v1/core/kv_cache_utils.py``), so
each token costs the drafter's bytes more. Checked on the real CPU engine
(``tests/e2e/test_eagle_drafters.py``):
a tiny Llama with an EAGLE-3, an EAGLE and a draft model of another KV shape holds the blocks this module
plans, to the block, and keeps as its own exactly the tensors counted here.

Not modelled, and said so in the plan's notes: other drafter classes (Cohere, MiniCPM, Llama 4, DeepSeek
EAGLE-3, DFlash, Medusa, MLP speculators), a drafter's KV of another shape beside a hybrid target or under
pipeline parallelism, an EAGLE drafter's own RoPE table (vLLM stretches its positions to the target's
length; a few MiB to tens of MiB where its RoPE settings are not the target's), and the drafter's share of the
profile's activation peak and of the CUDA graphs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from sidecar.budget.architecture import Architecture, architecture_from_config
from sidecar.budget.layer_kinds import LayerKind
from sidecar.errors import ConfigError

if TYPE_CHECKING:
    from sidecar.budget.ledger import PlanRequest

EAGLE3_CLASSES: Final = frozenset({
    "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3Qwen2_5vlForCausalLM",
    "Eagle3Qwen3vlForCausalLM", "Eagle3MiniMaxM2ForCausalLM", "Eagle3Qwen3ForCausalLM",
})  # fmt: skip
"""Drafter classes built as ``llama_eagle3.py`` / ``qwen3_eagle3.py`` build them (vLLM 0.32.0 registry)."""
EAGLE_CLASSES: Final = frozenset({"EagleLlamaForCausalLM"})
"""EAGLE-1 drafter classes built as ``llama_eagle.py`` builds them."""
DEFAULT_AUX_HIDDEN_STATES: Final = 3  # the target layers EAGLE-3 reads by default (llama_eagle3.py)
DRAFT_ID_BYTES: Final = 8  # draft_id_to_target_id is int64
GATED_MLP_MATRICES: Final = 3  # gate, up, down
EAGLE3_NORMS_PER_LAYER: Final = 3  # input_layernorm, post_attention_layernorm, hidden_norm


@dataclass(frozen=True, slots=True)
class Drafter:
    """A drafter's ``config.json``, as far as its memory goes."""

    architecture: Architecture
    draft_vocab_size: int  # EAGLE-3's LM head rows (``draft_vocab_size``, else the vocabulary)
    aux_hidden_states: int  # EAGLE-3's fc reads this many target hidden states (0: no fc)
    target_hidden_size: int | None = None  # EAGLE-3's fc input width per state (None: the drafter's hidden)
    norm_before_fc: bool = False
    fc_norm: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Drafter:
        """Read the fields vLLM's EAGLE classes and the draft model read (raises ``ConfigError``)."""
        arch = architecture_from_config(config)
        eagle = config.get("eagle_config") or {}
        if not isinstance(eagle, Mapping):
            raise ConfigError(
                f"the drafter's config.json has an eagle_config that is not an object: {eagle!r}"
            )
        layer_ids = eagle.get("eagle_aux_hidden_state_layer_ids") or ()
        aux = config.get("num_aux_hidden_states") or len(layer_ids) or DEFAULT_AUX_HIDDEN_STATES
        if not eagle.get("use_aux_hidden_state", True):
            aux = 0
        vocab, target_hidden = (
            config.get("draft_vocab_size") or arch.vocab_size,
            config.get("target_hidden_size"),
        )
        for name, value in (
            ("draft_vocab_size", vocab),
            ("num_aux_hidden_states", aux),
            ("target_hidden_size", target_hidden),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(
                    f"the drafter's config.json gives {name} {value!r}: a whole number is needed"
                )
        return cls(
            architecture=arch,
            draft_vocab_size=vocab,
            aux_hidden_states=aux,
            target_hidden_size=target_hidden,
            norm_before_fc=bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False))),
            fc_norm=bool(config.get("fc_norm", False)),
        )

    def model_class(self, method: str) -> str | None:
        """The class vLLM builds for this drafter under ``method`` (``EAGLEConfig``'s renaming)."""
        name = self.architecture.class_name
        if name is None:
            return None
        if method == "eagle3":
            return name if name.startswith("Eagle3") or name.endswith("Eagle3") else f"Eagle3{name}"
        if method == "eagle":
            return name if name.startswith("Eagle") else f"Eagle{name}"
        return name

    def modelled(self, method: str) -> bool:
        """Whether this module sizes this drafter under ``method``."""
        if method == "draft_model":
            return True
        return self.model_class(method) in (EAGLE3_CLASSES if method == "eagle3" else EAGLE_CLASSES)


def _split(value: int, tp: int) -> int:
    return -(-value // tp)


def _layer_elements(arch: Architecture, tp: int, qkv_input: int, norms: int) -> int:
    """One EAGLE decoder layer's elements on one GPU: attention over ``qkv_input``, MLP, ``norms`` norms."""
    hidden = arch.hidden_size
    q_out = _split(arch.num_attention_heads, tp) * arch.head_dim
    kv_out = arch.kv_heads_per_gpu(tp) * arch.head_dim
    attention = qkv_input * (q_out + 2 * kv_out) + q_out * hidden
    if arch.shape.attention_bias:
        attention += q_out + 2 * kv_out
    if arch.shape.qk_norm:
        attention += 2 * arch.head_dim
    mlp = GATED_MLP_MATRICES * hidden * _split(arch.intermediate_size, tp)  # LlamaMLP / Qwen3MLP
    return attention + mlp + norms * hidden


def eagle_weight_bytes(request: PlanRequest, drafter: Drafter, method: str, element: int) -> int:
    """An EAGLE or EAGLE-3 drafter's own weights on one GPU, ``element`` bytes a value (the target's)."""
    arch, target = drafter.architecture, request.architecture
    tp, hidden = request.tensor_parallel_size, arch.hidden_size
    own_embeddings = hidden != target.hidden_size  # vLLM shares the target's only at the same width
    total = 0
    if method == "eagle3":
        for index in range(arch.num_layers):
            total += _layer_elements(arch, tp, (2 if index == 0 else 1) * hidden, EAGLE3_NORMS_PER_LAYER)
        fc_input = drafter.aux_hidden_states * (drafter.target_hidden_size or hidden)
        total += fc_input * hidden + fc_input * (int(drafter.norm_before_fc) + int(drafter.fc_norm))
        total += hidden + _split(drafter.draft_vocab_size, tp) * hidden  # final norm, its own LM head
        mapped = drafter.draft_vocab_size != target.vocab_size  # draft ids mapped to the target's
        extra = drafter.draft_vocab_size * DRAFT_ID_BYTES if mapped else 0
    else:
        for index in range(arch.num_layers):
            total += _layer_elements(arch, tp, hidden, arch.shape.norms_per_layer - (1 if index == 0 else 0))
        total += 2 * hidden * hidden  # fc over the embedding and the hidden state; the target's LM head
        extra = 0
    if own_embeddings:
        total += _split(arch.vocab_size, tp) * hidden
    return total * element + extra


def drafter_layer_kinds(drafter: Drafter, method: str) -> tuple[LayerKind, ...]:
    """The drafter's attention layers: EAGLE's attend in full; a draft model's are its own kinds."""
    if method == "draft_model":
        return drafter.architecture.layer_kinds
    return (LayerKind.FULL,) * drafter.architecture.num_layers
