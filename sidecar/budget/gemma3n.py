"""Gemma 3n's text model as transformers 5.19 builds it: what its layers hold beyond Gemma 3's. Pure.

Read in transformers 5.19 (``models/gemma3n/modeling_gemma3n.py``: ``Gemma3nTextDecoderLayer``,
``Gemma3nTextAltUp``, ``Gemma3nTextLaurelBlock``, ``Gemma3nTextModel``); vLLM 0.32.0 loads the same tensors
(``vllm/model_executor/models/gemma3n.py``). Beside Gemma 3's attention (with QK norms), gated MLP and four
norms, each layer holds

* **AltUp** over ``altup_num_inputs`` (n) streams: a router ``n x hidden`` and its norm, prediction
  coefficients ``n^2 x n``, correction coefficients ``n x n`` and an output scale of ``hidden``;
* **LAuReL**: two projections through ``laurel_rank`` and a norm;
* **per-layer inputs**: a gate and a projection through ``hidden_size_per_layer_input`` and a norm, fed by
  one table of ``vocab_size_per_layer_input x (layers x hidden_size_per_layer_input)``, a projection from the
  hidden state and its norm (the same as Gemma 4's: :func:`sidecar.budget.gemma4.per_layer_input_parameters`);

and the model ``2 x (n - 1)`` AltUp projections of ``hidden x hidden``. The last ``num_kv_shared_layers``
layers have no ``k_proj``, ``v_proj`` or ``k_norm`` (they read an earlier layer's cache).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sidecar.budget.config_fields import first_int

GEMMA3N_TYPES: Final = frozenset({"gemma3n", "gemma3n_text"})


@dataclass(frozen=True, slots=True)
class Gemma3nLayers:
    """Gemma 3n's AltUp streams, LAuReL rank and per-layer inputs."""

    altup_inputs: int
    laurel_rank: int
    per_layer_input_size: int
    per_layer_vocab_size: int

    def layer_extras(self, hidden: int) -> int:
        """One layer's AltUp, LAuReL and per-layer input parameters."""
        n = self.altup_inputs
        altup = hidden + n * n + n * n * n + n * hidden + hidden
        laurel = 2 * hidden * self.laurel_rank + hidden
        per_layer = 2 * hidden * self.per_layer_input_size + hidden
        return altup + laurel + per_layer

    def model_extras(self, hidden: int, layers: int) -> int:
        """The per-layer input table, its projection and norm, and the AltUp projections."""
        width = self.per_layer_input_size
        table = self.per_layer_vocab_size * layers * width + hidden * layers * width + width
        return table + 2 * (self.altup_inputs - 1) * hidden * hidden


def gemma3n_layers(cfg: Mapping[str, Any], model_type: str) -> Gemma3nLayers | None:
    """Gemma 3n's extras from ``cfg`` (defaults filled in), ``None`` for any other family."""
    if model_type not in GEMMA3N_TYPES:
        return None
    return Gemma3nLayers(
        altup_inputs=first_int(cfg, "altup_num_inputs") or 1,
        laurel_rank=first_int(cfg, "laurel_rank") or 0,
        per_layer_input_size=first_int(cfg, "hidden_size_per_layer_input") or 0,
        per_layer_vocab_size=first_int(cfg, "vocab_size_per_layer_input") or 0,
    )
