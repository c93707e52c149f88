"""What ``run`` resolves after it has started: ``--model``, vLLM's ``--tokenizer`` and a drafter's model.

vLLM downloads the model, its ``--tokenizer`` and the drafter named in ``--speculative-config`` into the HF
cache while the sidecar already serves. Until the model resolves the sidecar proxies without a prediction;
until the tokenizer does, it counts prompts by estimate; until the drafter does, it predicts without the
drafter's share and says why in the plan's notes. :class:`LateResolver` tries
each again every ``--model-retry`` seconds, in a thread (resolving reads files and may download), says each
new reason once, and hands what it found to the monitor, which predicts with it from its next refresh.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

from structlog.typing import FilteringBoundLogger

from sidecar.budget.catalog import ResolvedModel, resolve_drafter
from sidecar.budget.speculative import SpeculativeSettings
from sidecar.errors import ConfigError, KvSidecarError
from sidecar.monitor.monitor import Monitor

T = TypeVar("T")


def drafter_or_raise(spec: SpeculativeSettings) -> SpeculativeSettings:
    """``spec`` with its drafter's config read, or a :class:`ConfigError` saying why not."""
    resolved = resolve_drafter(spec)
    if resolved is None or resolved.drafter is None:
        raise ConfigError(
            resolved.drafter_problem if resolved and resolved.drafter_problem else "not readable"
        )
    return resolved


class LateResolver:
    """Background tasks that resolve ``--model``, ``--tokenizer`` and a drafter once the HF cache has them."""

    def __init__(
        self,
        monitor: Monitor,
        log: FilteringBoundLogger,
        *,
        interval: float,
        clock: Callable[[], float],
        resolve_model: Callable[[], ResolvedModel] | None,
        on_model: Callable[[ResolvedModel], Awaitable[None]],
        resolve_tokenizer: Callable[[], Path] | None = None,
        on_tokenizer: Callable[[Path], Awaitable[None]] | None = None,
        tokenizer_problem: str | None = None,
    ) -> None:
        self.monitor, self.log, self.interval, self.clock = monitor, log, interval, clock
        self._resolve_model, self._on_model = resolve_model, on_model
        self._resolve_tokenizer, self._on_tokenizer = resolve_tokenizer, on_tokenizer
        self._tokenizer_problem = tokenizer_problem
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start a task for each of the model, tokenizer and drafter that did not resolve at start-up."""
        model = self.monitor.inputs.model
        if self._resolve_model is not None:
            self.log.warning("model_unresolved", model=model, reason=self.monitor.model_error)
            self.tasks.append(asyncio.create_task(self._model(self._resolve_model), name="kv-model"))
        if self._resolve_tokenizer is not None:
            self.log.warning("tokenizer_unresolved", reason=self._tokenizer_problem)
            self.tasks.append(
                asyncio.create_task(self._tokenizer(self._resolve_tokenizer), name="kv-tokenizer")
            )
        spec = self.monitor.inputs.speculative
        if spec is not None and spec.drafter_problem is not None:
            self.log.warning("drafter_unresolved", model=spec.model, reason=spec.drafter_problem)
            self.tasks.append(asyncio.create_task(self._drafter(spec), name="kv-drafter"))

    async def stop(self) -> None:
        """Cancel what is still trying."""
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _until_resolved(self, resolve: Callable[[], T], failed: Callable[[str], None]) -> T:
        while True:
            await asyncio.sleep(self.interval)
            try:
                return await asyncio.to_thread(resolve)
            except KvSidecarError as exc:
                failed(str(exc))

    def _model_failed(self, reason: str) -> None:
        if reason != self.monitor.model_error:
            self.log.warning("model_unresolved", model=self.monitor.inputs.model, reason=reason)
        self.monitor.model_error = reason

    async def _model(self, resolve: Callable[[], ResolvedModel]) -> None:
        resolved = await self._until_resolved(resolve, self._model_failed)
        self.monitor.set_architecture(resolved.architecture, resolved.source)
        await self._on_model(resolved)
        self.log.info("model_resolved", model=self.monitor.inputs.model, source=resolved.source)
        self.monitor.refresh(self.clock())

    def _each_new_reason(self, event: str, first: str | None, **fields: object) -> Callable[[str], None]:
        """A failure callback that logs ``event`` for each reason not said before (``first`` was)."""
        said = [first]

        def failed(reason: str) -> None:
            if reason not in said:
                self.log.warning(event, reason=reason, **fields)
                said.append(reason)

        return failed

    async def _drafter(self, spec: SpeculativeSettings) -> None:
        failed = self._each_new_reason("drafter_unresolved", spec.drafter_problem, model=spec.model)
        resolved = await self._until_resolved(partial(drafter_or_raise, spec), failed)
        self.monitor.set_speculative(resolved)
        self.log.info("drafter_resolved", model=spec.model, method=resolved.method)
        self.monitor.refresh(self.clock())

    async def _tokenizer(self, resolve: Callable[[], Path]) -> None:
        failed = self._each_new_reason("tokenizer_unresolved", self._tokenizer_problem)
        folder = await self._until_resolved(resolve, failed)
        if self._on_tokenizer is not None:
            await self._on_tokenizer(folder)
        self.log.info("tokenizer_resolved", folder=str(folder))
