"""The budget planner: a deployment's memory, predicted from ``config.json`` and vLLM settings.

Pure: nothing here performs I/O except reading the ``config.json`` or weight headers it is
pointed at. Typical use::

    from sidecar.budget import PlanRequest, build_ledger, resolve_gpu, resolve_model

    request = PlanRequest(resolve_model("qwen2.5-7b"), resolve_gpu("rtx4090").memory_bytes,
                          max_model_len=32768, concurrency=4)
    ledger = build_ledger(request)
"""

from sidecar.budget.advice import Option, advise
from sidecar.budget.architecture import Architecture, architecture_from_config, load_architecture
from sidecar.budget.catalog import GPUS, MODELS, Gpu, resolve_gpu, resolve_model
from sidecar.budget.layer_kinds import LayerKind
from sidecar.budget.ledger import Ledger, PlanRequest, build_ledger
from sidecar.budget.parameters import computed_parameter_count, parameter_count
from sidecar.budget.report import ledger_to_dict, render_table
from sidecar.budget.verdict import Verdict

__all__ = [
    "GPUS",
    "MODELS",
    "Architecture",
    "Gpu",
    "LayerKind",
    "Ledger",
    "Option",
    "PlanRequest",
    "Verdict",
    "advise",
    "architecture_from_config",
    "build_ledger",
    "computed_parameter_count",
    "ledger_to_dict",
    "load_architecture",
    "parameter_count",
    "render_table",
    "resolve_gpu",
    "resolve_model",
]
