"""What of a config the plan does not model, named so that ``plan``'s notes and the drift diagnosis say so.

A family the planner reads as Llama-shaped but that is not (found by planning transformers' default config of
every family vLLM 0.32.0 serves: ``tests/unit/test_defaults_sweep.py``) must not be planned silently. Each
feature below is recognised by the config fields that carry it; the first ones change the KV per token, so
the pool vLLM reports differs from the plan's (the sidecar admits by the engine's pool):

* a **sparse-attention indexer** shared between layers (``index_head_dim`` with ``indexer_types``:
  GLM-5-Next, Hunyuan v4) keeps a cache of its own beside the attention's and adds projections
  (DeepSeek-V3.2's and GLM-5's, one per layer, are modelled: :mod:`sidecar.budget.indexer`);
* **value heads of another size than the key heads** outside MLA and MiMo-V2 (``v_head_dim``; vLLM 0.32.0
  caches ``head_size + head_size_v`` per KV head, ``AttentionSpec``; MiMo-V2 is modelled,
  :mod:`sidecar.budget.mimo`);
* **sliding-window layers with a head geometry of their own** (``swa_num_key_value_heads``,
  ``swa_head_dim``, ``swa_v_head_dim``, ``num_sliding_attention_heads``: Inkling, Step-3.5; MiMo-V2's are
  modelled);
* **recurrent layer stacks** (``num_layers_per_stack``: HRM), whose weights repeat over cycles;
* **layer types no rule knows** (Inkling's ``hybrid_sliding``; DeepSeek-V4's compressed layers are modelled,
  :mod:`sidecar.budget.deepseek_v4`, and V4.1's, :mod:`sidecar.budget.deepseek_v41`): planned as full
  attention, which holds the most KV a layer can, so the pool is not overestimated;
* parameters only: **hyper-connections** (``hc_mult``), per-layer MLP widths that differ (planned at their
  mean), per-layer head sizes and per-layer input embeddings outside Gemma 3n and 4 (which model them);
  DeepSeek-V4's are modelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.budget.config_fields import first_int
from sidecar.budget.deepseek_v4 import v4_attention
from sidecar.budget.gemma3n import GEMMA3N_TYPES
from sidecar.budget.gemma4 import GEMMA4_TYPES
from sidecar.budget.indexer import INDEXED_TYPES
from sidecar.budget.layer_kinds import unlisted_layer_types
from sidecar.budget.mimo import MIMO_TYPES
from sidecar.budget.step3p5 import STEP3P5_TYPES

_SLIDING_GEOMETRY = (
    ("swa_num_key_value_heads", "num_key_value_heads"), ("swa_head_dim", "head_dim"),
    ("swa_v_head_dim", "v_head_dim"), ("swa_num_attention_heads", "num_attention_heads"),
    ("num_sliding_attention_heads", "num_attention_heads"),
)  # fmt: skip


def _differs(cfg: Mapping[str, Any], own: str, main: str) -> bool:
    value = first_int(cfg, own)
    return value is not None and value != first_int(cfg, main)


def unmodelled_features(
    cfg: Mapping[str, Any], widths: object, model_type: str, *, mla: bool
) -> tuple[str, ...]:
    """The features of ``cfg`` (defaults filled in) that the plan leaves out, in words."""
    features = []
    if isinstance(widths, list) and len(set(widths)) > 1:
        features.append("per-layer MLP widths (planned at their mean)")
    if model_type not in GEMMA4_TYPES | GEMMA3N_TYPES:
        if cfg.get("per_layer_config") or cfg.get("global_head_dim"):
            features.append("per-layer head sizes")
        if first_int(cfg, "hidden_size_per_layer_input"):
            features.append("per-layer input embeddings")
    v4 = v4_attention(cfg, model_type, 1) is not None  # modelled in sidecar.budget.deepseek_v4
    if (
        not v4
        and model_type not in INDEXED_TYPES
        and first_int(cfg, "index_head_dim", "index_n_heads") is not None
    ):
        features.append("sparse-attention indexer and its KV cache")
    mimo = model_type in MIMO_TYPES | STEP3P5_TYPES  # both modelled (sidecar.budget.mimo, .step3p5)
    if not mla and not mimo and _differs(cfg, "v_head_dim", "head_dim"):
        features.append("value heads of another size than the key heads (KV per token)")
    if not mimo and any(_differs(cfg, own, main) for own, main in _SLIDING_GEOMETRY):
        features.append("sliding-window layers' own head geometry (KV per token)")
    if first_int(cfg, "num_layers_per_stack") is not None:
        features.append("recurrent layer stacks")
    if (first_int(cfg, "hc_mult") or 0) > 1 and not v4:
        features.append("hyper-connections")
    unlisted = unlisted_layer_types(cfg)
    if unlisted and not v4:
        features.append(f"layer types {', '.join(unlisted)} (planned as full attention)")
    if first_int(cfg, "share_q_dim"):  # Step 3: q through a share_q_dim bottleneck (vLLM step3_text.py)
        features.append("a low-rank query projection (share_q_dim; parameters counted a little high)")
    return tuple(features)
