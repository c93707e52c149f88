"""vLLM 0.32's ``/v1/chat/completions/batch``: a list of conversations, each a prompt of its own.

The route bypassed admission until 2026-12-05, so one request could put any number of sequences into the
engine unplanned.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.outcomes import RefusedError
from sidecar.admission.tokens import load_counter
from sidecar.server.proxy import GENERATION_PATHS
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

ROUTE = "/v1/chat/completions/batch"
ONE = [{"role": "user", "content": "the KV cache grows"}]
TWO = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the KV cache"}]
IMAGE = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, "the KV cache"]}]


def test_each_conversation_is_a_prompt_counted_as_its_chat_would_be(model_dir: Path) -> None:  # noqa: F811
    counter = load_counter(str(model_dir))
    batch = request_facts(ROUTE, {"messages": [ONE, TWO], "max_completion_tokens": 7}, counter)
    singles = [request_facts("/v1/chat/completions", {"messages": m}, counter) for m in (ONE, TWO)]
    assert batch.prompts == tuple(s.prompts[0] for s in singles)
    assert batch.prompt_ids == tuple(s.prompt_ids[0] for s in singles if s.prompt_ids)
    assert (batch.exact, batch.sequences, batch.max_output_tokens, batch.media_items) == (True, 2, 7, 0)
    assert ROUTE in GENERATION_PATHS


def test_a_conversation_with_media_makes_the_batch_a_near_count(model_dir: Path) -> None:  # noqa: F811
    facts = request_facts(ROUTE, {"messages": [ONE, IMAGE]}, load_counter(str(model_dir)))
    assert (facts.exact, facts.prompt_ids, facts.media_items, len(facts.prompts)) == (False, None, 1, 2)


@pytest.mark.parametrize("messages", [[], "hi", None])
def test_messages_must_be_a_list_of_conversations(messages: object) -> None:
    with pytest.raises(RefusedError, match="messages"):
        request_facts(ROUTE, {"messages": messages}, load_counter(None))
