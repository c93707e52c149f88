"""Where ``run`` counts prompts from: the tokenizer vLLM uses, and the served model's architecture.

vLLM counts a prompt with its ``--tokenizer`` (default: ``--model``) at ``--tokenizer-revision`` (default:
``--revision``): the tokenizer's ``tokenizer.json``, its chat templates and a multimodal processor's template
all come from that folder or repository (``ModelConfig.__post_init__`` sets the defaults;
``resolve_chat_template`` in ``renderers/hf.py`` asks the processor at the tokenizer's path and revision;
``resolve_tokenizer_args`` in ``tokenizers/registry.py`` reads the Mistral files there; vLLM 0.32.0 and
0.34.0). The architecture that can choose vLLM's tokenizer mode (DeepSeek-V3.2, Kimi-K3, ...) is the served
model's own ``config.json``. :class:`CountingFiles` holds both folders as they resolve (either may resolve
late, once vLLM has filled the HF cache); :class:`PromptCounting` builds the counter from them and says how
it counts (the ``prompt_counts`` log line, ``/status``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from structlog.typing import FilteringBoundLogger

from sidecar.admission.conversation import EngineChat
from sidecar.admission.count_audit import CountAudit
from sidecar.admission.tokens import TokenCounter, counts_described, load_counter
from sidecar.budget.hub import resolve_tokenizer
from sidecar.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CountingFiles:
    """The folders a prompt is counted from, and why the tokenizer's is missing if it is."""

    tokenizer: str | None
    """The folder counted with: vLLM's ``--tokenizer`` once resolved, else ``--model``'s (or its text)."""
    config: str | None = None
    """The served model's folder, when ``tokenizer`` is another one (vLLM's ``--tokenizer``)."""
    told: str | None = None
    """vLLM's ``--tokenizer`` as given (a folder or a Hub id); ``None``: the model's own tokenizer."""
    problem: str | None = None
    """Why vLLM's ``--tokenizer`` did not resolve (counts are estimates until it does)."""

    def with_model(self, folder: Path) -> CountingFiles:
        """``--model`` resolved late: the tokenizer's folder, or beside ``--tokenizer`` the config's."""
        if self.told is None:
            return dataclasses.replace(self, tokenizer=str(folder))
        return dataclasses.replace(self, config=str(folder))

    def with_tokenizer(self, folder: Path) -> CountingFiles:
        """The ``--tokenizer`` folder resolved late."""
        return dataclasses.replace(self, tokenizer=str(folder), problem=None)

    def counter(self, chat: EngineChat) -> TokenCounter:
        """The counter these folders give (an estimating one while the tokenizer is missing). Reads files."""
        return load_counter(self.tokenizer, chat, config=Path(self.config) if self.config else None)

    def described(self, counter: TokenCounter) -> dict[str, Any]:
        """How prompts are counted, for the ``prompt_counts`` log line and ``/status``."""
        described = counts_described(counter)
        if self.told is not None:
            described["tokenizer"] = self.told
            if self.problem is not None:
                described["tokenizer_unresolved"] = self.problem
        return described


def separate_tokenizer(
    told: str | None, revision: str | None, model_folder: Path | None
) -> tuple[CountingFiles | None, Callable[[], Path] | None]:
    """Resolve vLLM's ``--tokenizer`` at ``revision`` (``--tokenizer-revision``, else ``--revision``).

    The files to count with (``None`` without ``--tokenizer``), and how to resolve it later when it does not
    resolve now (blocking: it reads the HF cache, and downloads unless ``HF_HUB_OFFLINE``).
    """
    if not told:
        return None, None
    resolve = partial(resolve_tokenizer, told, revision)
    config = str(model_folder) if model_folder else None
    try:
        return CountingFiles(str(resolve()), config, told), None
    except ConfigError as exc:
        return CountingFiles(None, config, told, str(exc)), resolve


class PromptCounting:
    """Builds the proxy's token counter from :class:`CountingFiles`, again whenever a folder resolves late."""

    def __init__(self, files: CountingFiles, chat: EngineChat, audit: CountAudit, log: FilteringBoundLogger):
        self.files, self.chat, self.audit, self.log = files, chat, audit, log

    def load(self) -> TokenCounter:
        """The counter the files give now; a log line and ``/status`` say what is exact. Reads files."""
        counter = self.files.counter(self.chat)
        self.audit.counting = self.files.described(counter)
        self.log.info("prompt_counts", **self.audit.counting)
        return counter

    async def reload(self, *, model: Path | None = None, tokenizer: Path | None = None) -> TokenCounter:
        """The counter once ``--model`` or ``--tokenizer`` has resolved (to ``model``, ``tokenizer``)."""
        if model is not None:
            self.files = self.files.with_model(model)
        if tokenizer is not None:
            self.files = self.files.with_tokenizer(tokenizer)
        return await asyncio.to_thread(self.load)


def count_disagrees(log: FilteringBoundLogger, key: tuple[str, str], counted: int, reported: int) -> None:
    """Log that vLLM's usage disagrees with an exact count of a route and model (the audit's callback)."""
    log.warning(
        "prompt_count_disagrees", route=key[0], model=key[1], counted=counted, vllm=reported,
        advice="tell the sidecar vLLM's --tokenizer and chat flags (until then vLLM's counts refuse)",
    )  # fmt: skip
