"""For the probes that load vLLM in their own process (run with vLLM's python): one engine after another.

:func:`print_engines` loads each ``(label, LLM keyword arguments)`` in turn in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so that ``view`` reaches the worker through ``collective_rpc``; the CPU
backend's KV space is 1 GiB unless ``VLLM_CPU_KVCACHE_SPACE`` says otherwise), prints one ``TAG {json}`` line
per engine with its label and what ``view`` returned, and frees it before the next. The probes import it as a
sibling module: a script's own folder is first on ``sys.path``.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def print_engines(
    tag: str, runs: Iterable[tuple[str, dict[str, Any]]], view: Callable[[Any], dict[str, Any]]
) -> None:
    """Load each engine, print ``tag`` and the JSON of ``{"run": label, **view(worker)}``, free it."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM  # noqa: PLC0415 - vLLM reads the environment above when it is imported

    for label, arguments in runs:
        llm = LLM(**arguments)
        print(f"{tag} " + json.dumps({"run": label, **llm.collective_rpc(view)[0]}), flush=True)
        del llm
        gc.collect()


def probe_main(make: Callable[[Path, Path], None], measure: Callable[[Path], None]) -> None:
    """A probe's command line: ``make TOKENIZER_DIR OUT`` builds its models, ``measure OUT`` loads them."""
    import sys  # noqa: PLC0415 - only a probe run as a script reads its arguments

    command, *args = sys.argv[1:]
    if command == "make":
        make(Path(args[0]), Path(args[1]))
    else:
        measure(Path(args[0]))


def save_model(model: Any, folder: Path, tokenizer_dir: Path) -> None:
    """Save a transformers model in bf16 to ``folder`` with the tiny model's tokenizer beside it."""
    import torch  # noqa: PLC0415 - vLLM's python has it; the module's other users need not import it

    model.to(torch.bfloat16).save_pretrained(folder)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / file, folder / file)


def pool_view(worker: Any) -> dict[str, Any]:
    """The KV cache's block size, blocks and maximum concurrency, for a probe's ``view`` to extend."""
    runner = worker.model_runner
    return {
        "block_size": runner.cache_config.block_size,
        "num_blocks": runner.kv_cache_config.num_blocks,
        "max_concurrency": runner.cache_config.kv_cache_max_concurrency,
    }


def drafter_view(worker: Any) -> dict[str, Any]:
    """The KV cache's block size, groups (layer names) and blocks, and the drafter's own parameters' names.

    "Own": the drafter's parameters that are not the target's (vLLM shares embeddings or LM head by handing
    the drafter the target's modules, so a shared one is the same object).
    """
    runner = worker.model_runner
    target = {id(p) for p in runner.model.parameters()}
    drafter = getattr(getattr(runner, "drafter", None), "model", None)
    own = [] if drafter is None else [n for n, p in drafter.named_parameters() if id(p) not in target]
    config = runner.kv_cache_config
    return {
        "block_size": runner.cache_config.block_size,
        "groups": [sorted(group.layer_names) for group in config.kv_cache_groups],
        "num_blocks": config.num_blocks,
        "drafter_own": sorted(own),
    }
