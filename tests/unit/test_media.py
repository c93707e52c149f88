"""A chat's images, audio and video: told as vLLM tells them, planned at what they take, learned from ``usage``.

The model's processor expands each media part into placeholder tokens (a 112 x 112 image is several tokens
for Qwen2-VL) that hold KV blocks like any prompt token. The sidecar counted only the text (its template
rendered without the media parts, and called exact), so admission planned a request with four images at the
size of its question, and the prefix hashes of two requests with the same text but different images matched.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.admission.body import RequestFacts, request_facts
from sidecar.admission.capacity import Demand
from sidecar.admission.geometry import PoolView
from sidecar.admission.outcomes import Lane
from sidecar.admission.outputs import MediaTokens, OutputLengths, OutputSettings
from sidecar.admission.planner import CapacityPlanner
from sidecar.admission.tickets import Ticket
from sidecar.admission.tokens import EstimatingCounter, TokenizerCounter, load_counter, media_parts
from sidecar.server.wire import AnswerLength
from tests.unit.test_backfill import fresh_controller, req
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
TEXT = {"type": "text", "text": "what is in it?"}
POOL = PoolView(blocks=64, block_size=16)

MEDIA_CONTENTS: list[tuple[Any, int]] = [
    ("just text", 0),
    ([TEXT, "a plain string part"], 0),
    ([IMAGE, TEXT], 1),
    ([IMAGE, IMAGE, TEXT], 2),
    ([{"image_url": "http://x/a.png"}], 1),  # no type, a media key: vLLM's simple image part
    ([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}], 1),
    ([{"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}], 1),
    ([{"type": "input_image", "image_url": "http://x/a.png"}], 1),  # the Responses API's spelling
    ([{"type": "image_embeds", "image_embeds": "AAAA"}], 1),
    ([{"type": "refusal", "refusal": "no"}, {"type": "thinking", "thinking": "hm"}], 0),
    ([{"type": "input_text", "text": "a"}, {"type": "output_text", "text": "b"}], 0),
    ([{"type": "tool_reference", "name": "search"}], 0),
    ([{"type": "text", "text": "a", "image_url": "http://x/a.png"}], 1),  # a media key whatever the type
    ([{"type": 5}], 1),  # not a string: vLLM calls it non-text (and then refuses it)
    ([{"type": "hologram"}], 1),
    (None, 0),
]


@pytest.mark.parametrize(("content", "count"), MEDIA_CONTENTS)
def test_media_parts_are_told_as_vllm_tells_them(content: Any, count: int) -> None:
    assert media_parts(content) == count


def test_a_chat_with_media_is_counted_as_its_text_and_never_exact(model_dir: Path) -> None:  # noqa: F811
    counter = load_counter(str(model_dir))
    assert isinstance(counter, TokenizerCounter)
    text_only = [{"role": "user", "content": [TEXT]}]
    with_images = [{"role": "user", "content": [IMAGE, IMAGE, TEXT]}]
    plain = request_facts("/v1/chat/completions", {"messages": text_only}, counter)
    media = request_facts("/v1/chat/completions", {"messages": with_images}, counter)
    assert (plain.exact, plain.media_items) == (True, 0)
    assert plain.prompt_ids is not None
    assert (media.exact, media.media_items, media.prompt_ids) == (False, 2, None)  # no 400, no shared blocks
    assert media.prompts == plain.prompts  # the text's tokens; the planner adds the media's
    responses = request_facts("/v1/responses", {"input": [{"role": "user", "content": [IMAGE]}]}, counter)
    assert responses.media_items == 1


@pytest.mark.parametrize(
    ("items", "samples", "planned"),
    [
        (0, [], 100),  # no media: the text alone
        (2, [], 1024),  # nothing learned yet: the whole context
        (2, [(2, 100, 260)], 100 + 2 * 200),  # one answer: 80 a item, x (1.25 + 1.25) after one sample
        (1, [(4, 100, 500)], 100 + 250),  # learned per item, whatever the count of the answer it came from
        (8, [(1, 100, 300)], 1024),  # never past the context
        (2, [(2, 500, 400)], 100),  # usage below the text (an estimate too high): nothing a item
    ],
)
def test_media_are_planned_at_what_answers_said_they_took(
    items: int, samples: list[tuple[int, int, int]], planned: int
) -> None:
    media = MediaTokens()
    for count, text, prompt_tokens in samples:
        media.learn(("/v1/chat/completions", "m"), count, text, prompt_tokens)
    facts = RequestFacts((100,), 50, exact=False, route="/v1/chat/completions", model="m", media_items=items)
    assert media.planned(facts, 1024) == (planned,)


def test_the_output_bound_stays_the_room_the_text_leaves() -> None:
    """A 4-image chat of 100 text tokens on a 1024 context: planned at the whole context until an answer says
    what the images take, and its output's hard bound is what the text alone leaves (924), not 0: the ledger
    plans a request to end once it reaches its bound, and the real one may run that far."""
    planner = CapacityPlanner(pool=lambda: POOL, max_model_len=lambda: 1024)
    facts = replace(req(100, 2000, ignore_eos=False), route="/v1/chat/completions", media_items=4)
    assert planner.demand(facts, ()) == Demand((1024,), 1, 924, 924, 1024)
    planner.media.learn(("/v1/chat/completions", ""), 4, 100, 100 + 4 * 64)
    assert planner.demand(facts, ()) == Demand((100 + 4 * 160,), 1, 924, 924, 1024)
    assert planner.expected_tokens(facts) == 100 + 4 * 160 + 924


@pytest.mark.parametrize(
    ("tail", "prompt_tokens"),
    [
        (b'{"usage":{"prompt_tokens":412,"total_tokens":420,"completion_tokens":8}}', 412),
        (b'data: {"choices":[],"usage":{"prompt_tokens": 97,"completion_tokens":3}}\n\ndata: [DONE]\n\n', 97),
        (b'{"choices":[{"text":"no usage here"}]}', None),
    ],
)
def test_the_proxy_reads_the_answers_prompt_tokens(tail: bytes, prompt_tokens: int | None) -> None:
    answer = AnswerLength(Ticket(lane=Lane.SHORT, reserved_tokens=0, admitted_at=0.0))
    answer.feed(tail)
    assert answer.prompt_tokens() == prompt_tokens


def test_an_estimating_counter_also_counts_media() -> None:
    facts = request_facts(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [IMAGE, TEXT]}]},
        EstimatingCounter(),
    )
    assert (facts.media_items, facts.exact) == (1, False)


@pytest.mark.parametrize(("items", "usage", "bound"), [(2, 420, 400), (2, None, None), (0, 420, None)])
async def test_a_released_answer_teaches_what_its_media_took(
    items: int, usage: int | None, bound: int | None
) -> None:
    controller = fresh_controller(POOL, CollectorRegistry())
    facts = replace(req(100, 16, ignore_eos=False), tenant="t", wait_limit=5.0, media_items=items, model="m")
    ticket = await controller.admit(facts)
    assert ticket.media_items == items
    ticket.prompt_usage = usage
    controller.release(ticket)
    assert controller.planner.media.lengths.bound("/v1/completions", "m") == bound  # 160 a item, x 2.5


@pytest.mark.parametrize(
    ("body", "prompts", "items", "exact"),
    [
        ({"prompt_embeds": "AAAA"}, (0,), 1, False),  # no prompt needed: vLLM 0.32 takes embeds alone
        ({"prompt_embeds": ["AAAA", "BBBB"], "prompt": ""}, (0, 0), 2, False),
        ({"prompt_embeds": "AAAA", "prompt": [1, 2, 3]}, (0, 3), 1, False),  # embeds first, then the text
        ({"prompt": [1, 2, 3], "prompt_embeds": []}, (3,), 0, True),  # an empty list is no embeds
        ({"prompt": [1, 2, 3], "suffix": "abcd"}, (4,), 0, False),  # FIM: the suffix's text is added
        ({"prompt": [1, 2, 3], "suffix": ""}, (3,), 0, True),
    ],
)
def test_a_completions_embeddings_and_suffix_are_prompt_tokens_only_the_engine_counts(
    body: dict[str, Any], prompts: tuple[int, ...], items: int, exact: bool
) -> None:
    facts = request_facts("/v1/completions", body, EstimatingCounter())
    assert (facts.prompts, facts.media_items, facts.exact) == (prompts, items, exact)
    assert (facts.prompt_ids is None) is not exact


def test_each_embedding_is_planned_at_its_own_learned_size() -> None:
    media = MediaTokens()
    media.learn(("/v1/completions", "m"), 2, 0, 2 * 40)  # two prompts of 40 rows each: 40 an item, x 2.5
    facts = RequestFacts((0, 0, 3), 16, exact=False, route="/v1/completions", model="m", media_items=2)
    assert media.planned(facts, 1024) == (100, 100, 103)  # one item each (rounded up over three prompts)


@pytest.mark.parametrize(
    ("items", "samples", "wanted"), [(0, 0, False), (1, 0, True), (1, 19, True), (1, 20, False)]
)
def test_media_are_probed_until_usage_is_trusted(items: int, samples: int, wanted: bool) -> None:
    media = MediaTokens(OutputLengths(OutputSettings()))
    for _ in range(samples):
        media.learn(("/v1/chat/completions", "m"), 1, 10, 60)
    facts = RequestFacts((10,), 16, exact=False, route="/v1/chat/completions", model="m")
    assert media.wants(replace(facts, media_items=items)) is wanted
