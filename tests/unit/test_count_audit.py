"""Exact counts checked against vLLM's usage: a count vLLM disagrees with no longer refuses.

An exact count refuses a prompt of ``max_model_len`` tokens or more before vLLM sees it. When the sidecar's
tokenizer or template is not vLLM's (vLLM run with ``--chat-template``, another tokenizer revision), its
"exact" count is wrong and could refuse what vLLM serves; nothing noticed. Now each answer's usage checks
the count, and the first disagreement on a route and model stops exact counts there from refusing.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from sidecar.admission.body import RequestFacts
from sidecar.admission.count_audit import CountAudit, audited_prompt
from sidecar.admission.outcomes import Reason, RefusedError
from sidecar.server.metrics import AdmissionCollector
from tests.unit.test_controller import admit, make

CHAT = RequestFacts(prompts=(100,), max_output_tokens=10, exact=True, route="/v1/chat/completions", model="m")


@pytest.mark.parametrize(
    ("facts", "audited"),
    [
        (CHAT, 100),
        (replace(CHAT, exact=False), None),  # an estimate decides no refusal: nothing to check
        (replace(CHAT, prompts=(100, 50)), None),  # a batch's usage sums its prompts
        (replace(CHAT, media_items=1), None),  # vLLM adds the media's tokens
        (replace(CHAT, truncate_prompt_tokens=50), None),  # vLLM truncates
        (replace(CHAT, truncate_prompt_tokens=-1), None),
        (replace(CHAT, choices=3), 100),  # n sequences share one prompt in the usage
    ],
)
def test_only_one_exact_prompt_is_checked(facts: RequestFacts, audited: int | None) -> None:
    assert audited_prompt(facts) == audited


def test_the_first_disagreement_ends_trust_on_its_route_and_model_only() -> None:
    told: list[tuple[tuple[str, str], int, int]] = []
    audit = CountAudit(on_distrust=lambda key, counted, reported: told.append((key, counted, reported)))
    chat, completions = ("/v1/chat/completions", "m"), ("/v1/completions", "m")
    audit.record(chat, 100, 100)
    audit.record(chat, None, 90)  # not checkable
    audit.record(chat, 100, None)  # no usage in the answer
    assert audit.trusts(chat)
    assert audit.checks == {"agree": 1, "disagree": 0}
    audit.record(chat, 120, 104)
    audit.record(chat, 130, 114)
    audit.record(completions, 7, 7)
    assert not audit.trusts(chat)
    assert audit.trusts(completions)
    assert audit.checks == {"agree": 2, "disagree": 2}
    assert audit.distrusted == {chat: (120, 104)}
    assert told == [(chat, 120, 104)]  # once per key


async def test_a_count_vllm_disagreed_with_no_longer_refuses() -> None:
    controller, registry = make()
    long_chat = replace(CHAT, prompts=(1030,))  # at or above max_model_len (1024): vLLM would refuse it
    with pytest.raises(RefusedError) as refused:
        await admit(controller, long_chat)
    assert refused.value.reason is Reason.CONTEXT_LENGTH_EXCEEDED
    ticket = await admit(controller, CHAT)
    ticket.prompt_usage = 97  # vLLM rendered the chat otherwise
    controller.release(ticket)
    granted = await asyncio.wait_for(admit(controller, long_chat), 1)  # left to vLLM, which answers itself
    controller.release(granted)
    other = replace(long_chat, route="/v1/completions")
    with pytest.raises(RefusedError):  # its route's counts were never wrong
        await admit(controller, other)
    registry.register(AdmissionCollector(controller))
    checks = {result: registry.get_sample_value("kv_sidecar_prompt_count_checks_total", {"result": result})
              for result in ("agree", "disagree")}  # fmt: skip
    assert checks == {"agree": 0.0, "disagree": 1.0}


async def test_an_answer_that_agrees_keeps_exact_counts_refusing() -> None:
    controller, _ = make()
    ticket = await admit(controller, CHAT)
    ticket.prompt_usage = 100
    controller.release(ticket)
    with pytest.raises(RefusedError):
        await admit(controller, replace(CHAT, prompts=(1030,)))
    assert controller.audit.checks == {"agree": 1, "disagree": 0}
