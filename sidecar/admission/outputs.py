"""Expected output lengths: the client's bound, or what answers on this route and model really took. Pure.

Theory of operation
-------------------
vLLM reserves nothing for the output: a request's blocks grow with the answer, and a request
without ``max_tokens`` may run to the context length (``vllm/entrypoints/utils.py``,
``get_max_tokens``: the default is ``max_model_len - prompt``). Reserving every request's bound in
full serialises chat traffic that never comes near it. So the sidecar learns:

* every completed answer's length (``usage.completion_tokens`` of a JSON answer, or the streamed
  chunks counted, where a chunk is a token: not with speculative decoding or a ``stream_interval``
  above one, ``CapacityPlanner.release``) is one sample for its key, the route and model it was asked
  of, unless the client fixed it: with ``ignore_eos`` vLLM drops the model's end-of-sequence ids from
  the stop checks (``SamplingParams.update_from_generation_config``; ``check_stop`` in
  ``v1/core/sched/utils.py``, 0.32.0), so the answer runs to ``max_tokens`` or the client's own stops
  and says nothing of where the model stops; a window of such benchmark-style answers would otherwise
  set the bound for every request that may stop early;
* the key's *bound* is a high quantile (``--output-quantile``, default 0.95) of the last
  ``window`` samples once there are ``trusted_samples`` of them (20: enough for a nearest-rank p95
  to stop being the maximum); before that, from the first answer on, it is the largest answer seen
  times ``1.25 + 1.25 / n`` for ``n`` answers (2.5x after one, 1.56x after four, 1.31x after
  nineteen): with ``n`` answers the next one exceeds all of them with probability ``1 / (n + 1)``,
  so the margin shrinks as the evidence grows, and the ledger's growth tracking and the live gauge
  cover the rest; before any answer of its own, the prior is the engine's record: the quantile of
  vLLM's ``vllm:request_generation_tokens`` histogram (every finished request since the engine
  started, all routes), read as the upper bound of the bucket it falls in, once it holds
  ``trusted_samples`` requests; a fresh engine has no record, and then the client's own
  ``max_tokens`` or, without one, the room left in the context holds;
* a request's expected output is its client bound when that is below the learned bound, else the
  learned bound; never below ``min_tokens``; with ``ignore_eos`` (vLLM generates exactly
  ``max_tokens``) always the client bound. The ledger lets a request that runs past its
  expectation grow (see :mod:`sidecar.admission.capacity`), and the live gauge catches the rest.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from sidecar.admission.body import RequestFacts


@dataclass(frozen=True, slots=True)
class OutputSettings:
    """How the learned bound is formed."""

    quantile: float = 0.95
    min_samples: int = 1
    trusted_samples: int = 20
    window: int = 256
    small_sample_margin: float = 1.25
    stream_interval: int = 1  # the engine's --stream-interval: the tokens vLLM gathers into one event

    def __post_init__(self) -> None:
        if self.stream_interval < 1:
            raise ValueError("the stream interval must be at least 1")
        if not 0.5 <= self.quantile <= 1.0:
            raise ValueError("the output quantile must be within [0.5, 1]")
        if not 1 <= self.min_samples <= self.trusted_samples <= self.window:
            raise ValueError("the output samples must satisfy 1 <= min_samples <= trusted_samples <= window")


@dataclass(slots=True)
class OutputLengths:
    """Recent answer lengths per (route, model), and the bound they give."""

    settings: OutputSettings = field(default_factory=OutputSettings)
    _samples: dict[tuple[str, str], deque[int]] = field(default_factory=dict)
    engine_record: tuple[tuple[float, float], ...] = ()  # vLLM's histogram: (upper bound, cumulative)
    _engine_bound: int | None = None
    _bounds: dict[tuple[str, str], int | None] = field(default_factory=dict)  # per key, until its next answer
    revision: int = 0  # counts every change of what :meth:`expected` answers from

    def learn_engine_record(self, record: tuple[tuple[float, float], ...]) -> None:
        """Take a scrape's view of the engine's histogram; its bound is computed here, once per scrape."""
        if record == self.engine_record:
            return
        self.engine_record = record
        self._engine_bound = None
        self.revision += 1
        total = record[-1][1] if record else 0.0
        if total < self.settings.trusted_samples:
            return
        for bound, cumulative in record:
            if cumulative >= self.settings.quantile * total:
                self._engine_bound = None if math.isinf(bound) else math.ceil(bound)
                return

    def engine_bound(self) -> int | None:
        """The quantile of the engine's record (a bucket's upper bound), or ``None`` without enough of it."""
        return self._engine_bound

    def record(self, route: str, model: str, completion_tokens: int) -> None:
        """One answer on ``route`` for ``model`` took ``completion_tokens`` per choice."""
        window = self._samples.setdefault((route, model), deque(maxlen=self.settings.window))
        window.append(max(0, completion_tokens))
        self._bounds.pop((route, model), None)
        self.revision += 1

    def samples(self, route: str, model: str) -> int:
        """How many answers are known for the key."""
        return len(self._samples.get((route, model), ()))

    def bound(self, route: str, model: str) -> int | None:
        """The learned bound (see the module docstring), or ``None`` before ``min_samples`` answers.

        Asked several times per admission decision, it changes only with an answer: kept per key until then.
        """
        key = (route, model)
        if key in self._bounds:
            return self._bounds[key]
        self._bounds[key] = found = self._bound(key)
        return found

    def _bound(self, key: tuple[str, str]) -> int | None:
        window = self._samples.get(key)
        if window is None or len(window) < self.settings.min_samples:
            return None
        if len(window) < self.settings.trusted_samples:
            margin = self.settings.small_sample_margin
            return math.ceil(max(window) * (margin + margin / len(window)))
        ordered = sorted(window)
        rank = max(1, math.ceil(self.settings.quantile * len(ordered)))
        return ordered[rank - 1]

    def bounds(self) -> list[dict[str, object]]:
        """Every key's learned bound and sample count (for ``/status``)."""
        return [
            {"route": route, "model": model, "samples": len(window), "bound": self.bound(route, model)}
            for (route, model), window in sorted(self._samples.items())
        ]

    def expected(self, facts: RequestFacts, max_model_len: int) -> tuple[int, int]:
        """(expected, hard bound) output tokens per sequence of ``facts``'s largest prompt."""
        room = max(0, max_model_len - facts.prompt_tokens)
        hard = room if facts.max_output_tokens is None else min(facts.max_output_tokens, room)
        if facts.ignore_eos:
            return hard, hard
        learned = self.bound(facts.route, facts.model)
        if learned is None:
            learned = self.engine_bound()
        expected = hard if learned is None else min(hard, learned)
        return max(expected, min(facts.min_output_tokens, hard)), hard


@dataclass(slots=True)
class MediaTokens:
    """Prompt tokens per media item, per (route, model), learned from ``usage``.

    Media items: a chat's images, audio and video, and a completion's ``prompt_embeds`` (a prompt each, of
    as many tokens as the tensor has rows).

    The model's processor expands each media part into placeholder tokens that hold KV blocks like any
    prompt token, as many as the item's size and the processor say (vLLM 0.32.0: ``_get_prompt_updates`` of
    each model's processor, e.g. ``qwen2_vl.py``), which the sidecar cannot count. An answer's
    ``usage.prompt_tokens`` (which counts them: ``len(prompt_token_ids)`` after the expansion) less its
    text's tokens, over its items, is one sample, and the bound is formed as answer lengths' are
    (:class:`OutputLengths`). Until a key has a sample, a request with media is planned at the whole
    context, the most vLLM lets a sequence hold. Only the planned prompt grows: the output's hard bound
    stays the room the text alone leaves, an upper bound of the real one, so an end is never planned early.
    """

    lengths: OutputLengths = field(default_factory=OutputLengths)

    def planned(self, facts: RequestFacts, max_model_len: int) -> tuple[int, ...]:
        """``facts``'s prompts with its media's tokens: the learned bound per item, else the whole context."""
        if not facts.media_items:
            return facts.prompts
        per_item = self.lengths.bound(facts.route, facts.model)
        if per_item is None:
            return tuple(max_model_len for _ in facts.prompts)
        items = math.ceil(facts.media_items / max(1, len(facts.prompts)))  # a chat's all; an embedding each
        return tuple(min(max_model_len, p + items * per_item) for p in facts.prompts)

    def wants(self, facts: RequestFacts) -> bool:
        """Whether ``facts`` has media whose key has fewer than ``trusted_samples`` samples yet."""
        samples = self.lengths.samples(facts.route, facts.model)
        return facts.media_items > 0 and samples < self.lengths.settings.trusted_samples

    def learn(self, key: tuple[str, str], items: int, text_tokens: int, prompt_tokens: int) -> None:
        """An answer to ``items`` media and ``text_tokens`` of text said its prompt took ``prompt_tokens``."""
        if items > 0:
            self.lengths.record(key[0], key[1], math.ceil(max(0, prompt_tokens - text_tokens) / items))
