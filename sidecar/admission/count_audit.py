"""Whether the prompt counts the sidecar calls exact are vLLM's own: each answer's usage says. Pure.

Theory of operation
-------------------
An exact count is what lets the sidecar refuse a prompt of ``max_model_len`` tokens or more before vLLM
sees it (:mod:`sidecar.admission.parity`); an estimate never refuses. A count is exact when the prompt
is token ids, or when the sidecar renders and tokenizes it as vLLM does. That rests on facts outside the
sidecar's view: the tokenizer vLLM loaded (its ``--tokenizer``, a revision), the chat template it renders
(its ``--chat-template``, a template changed since the sidecar read the model), how its release rebuilds
messages and tools (:mod:`sidecar.admission.conversation`, read in 0.32.0). Each answer settles it: vLLM
reports the prompt it built in ``usage.prompt_tokens`` (``input_tokens`` on the Responses route),
``len(prompt_token_ids)`` (``chat_completion/serving.py``, ``completion/serving.py``, 0.32.0).

So every answer to a request whose one prompt was counted exact (no media, whose tokens vLLM adds; no
``truncate_prompt_tokens``, which vLLM applies) compares the count with the usage. The first disagreement
on a route and model ends the trust in exact counts there: from then on they no longer refuse (vLLM gives
its own answer, as for an estimate), until the sidecar restarts with the engine it fronts. The counts
still plan admission, a few tokens off. The checks are counted by result (``kv_sidecar_prompt_count_checks``)
and the first disagreement per route and model is logged once with both numbers.

A prompt the sidecar would refuse as too long is counted by vLLM first where it can be
(:mod:`sidecar.admission.recount`): that count is checked here like an answer's usage, and what came of
each recount is tallied (``kv_sidecar_prompt_recounts``): ``refused`` (vLLM's count is too long as well),
``served`` (vLLM's count fits: the sidecar's would have refused what vLLM serves), ``unanswered`` (vLLM
gave no count in time, or too many recounts were in flight: judged on the sidecar's count as before).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sidecar.admission.body import RequestFacts

Key = tuple[str, str]
"""A route and a model."""
RECOUNT_RESULTS = ("refused", "served", "unanswered")


def audited_prompt(facts: RequestFacts) -> int | None:
    """The count an answer's usage can check: the one exact prompt, without media or truncation."""
    if (
        not facts.exact
        or len(facts.prompts) != 1
        or facts.media_items
        or facts.truncate_prompt_tokens is not None
    ):
        return None
    return facts.prompts[0]


@dataclass
class CountAudit:
    """Exact counts against vLLM's usage, per route and model; see the module docstring."""

    on_distrust: Callable[[Key, int, int], None] | None = None
    """Called once per key, at its first disagreement, with the count and vLLM's."""
    checks: dict[str, int] = field(default_factory=lambda: {"agree": 0, "disagree": 0})
    distrusted: dict[Key, tuple[int, int]] = field(default_factory=dict)
    """Each key whose counts disagreed: its first count and vLLM's."""
    recounts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RECOUNT_RESULTS, 0))
    """What came of the prompts vLLM was asked to count before a refusal, by result (module docstring)."""
    counting: dict[str, object] = field(default_factory=dict)
    """How prompts are counted (``tokens.counts_described``): set when the counter is loaded."""

    def trusts(self, key: Key) -> bool:
        """Whether exact counts on ``key`` may refuse a request."""
        return key not in self.distrusted

    def record(self, key: Key, counted: int | None, reported: int | None) -> None:
        """An answer's usage prompt tokens (``reported``) against the count (``counted``), if both exist."""
        if counted is None or reported is None:
            return
        agree = counted == reported
        self.checks["agree" if agree else "disagree"] += 1
        if not agree and key not in self.distrusted:
            self.distrusted[key] = (counted, reported)
            if self.on_distrust is not None:
                self.on_distrust(key, counted, reported)
