"""A Responses request's chat fields as vLLM derives them, and vLLM's ``--reasoning-effort-map``.

vLLM 0.32's Responses route renders its prompt with ``reasoning.effort`` as the template's ``reasoning_effort``
(and ``enable_thinking``), continues a final item whose ``status`` is ``in_progress`` or ``incomplete`` without
a generation prompt, and ignores the chat route's ``reasoning_effort``, ``documents``,
``continue_final_message``, ``add_generation_prompt`` and ``chat_template`` fields, which the Responses request
lacks (``ResponsesRequest.build_chat_params``, ``should_continue_final_message``). The sidecar read the chat
route's fields on both routes: on the real server (Qwen3's template) it counted 18 tokens where vLLM built 35
for ``reasoning: {"effort": "none"}``, 50 for 39 with an in-progress final answer, and 35 for 18 when a client
sent ``reasoning_effort`` to ``/v1/responses``. vLLM 0.33 and 0.34 rewrite the effort with
``--reasoning-effort-map`` before ``enable_thinking`` follows from it (``map_reasoning_effort``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.conversation import EngineChat, as_rendered, mapped_effort
from sidecar.admission.recount import tokenize_bodies
from sidecar.admission.tokens import load_counter
from sidecar.cli import build_parser
from sidecar.errors import UsageError
from sidecar.flags import effort_map
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

TEMPLATE = (
    "{% if reasoning_effort %}effort {{ reasoning_effort }}\n{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}no thinking\n{% endif %}"
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "The blocks"}]}


def _count(model: Path, route: str, body: dict[str, Any], effort: dict[str, str] | None = None) -> int:
    counter = load_counter(str(model), EngineChat(template=TEMPLATE, reasoning_effort_map=effort or {}))
    facts = request_facts(route, body, counter, effort_map=effort)
    assert facts.exact
    return facts.prompts[0]


@pytest.mark.parametrize(
    ("responses", "chat"),
    [
        ({"input": "hi", "reasoning": {"effort": "none"}}, {"reasoning_effort": "none"}),
        ({"input": "hi", "reasoning": {"effort": "high"}}, {"reasoning_effort": "high"}),
        ({"input": "hi", "reasoning_effort": "none", "documents": [{"t": "x"}]}, {}),  # not Responses fields
        ({"input": "hi", "add_generation_prompt": False, "continue_final_message": True}, {}),
        ({"input": "hi", "chat_template": "{{ 1 }}"}, {}),  # the server's template all the same
        (
            {
                "input": "hi",
                "reasoning": {"effort": "none"},
                "chat_template_kwargs": {"enable_thinking": True},
            },
            {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
        ),
    ],
)
def test_a_responses_request_renders_with_the_fields_vllm_derives(
    model_dir: Path,  # noqa: F811
    responses: dict[str, Any],
    chat: dict[str, Any],
) -> None:
    chat_body = {"messages": [{"role": "user", "content": "hi"}], **chat}
    assert _count(model_dir, RESPONSES, responses) == _count(model_dir, CHAT, chat_body)


@pytest.mark.parametrize("status", ["in_progress", "incomplete"])
def test_an_unfinished_final_answer_is_continued(model_dir: Path, status: str) -> None:  # noqa: F811
    """``should_continue_final_message``: no generation prompt, the answer left open."""
    body = {"input": [{"role": "user", "content": "q"}, {**ANSWER, "status": status}]}
    continued = {
        "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The blocks"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    assert _count(model_dir, RESPONSES, body) == _count(model_dir, CHAT, continued)
    finished = {"input": [{"role": "user", "content": "q"}, {**ANSWER, "status": "completed"}]}
    assert _count(model_dir, RESPONSES, finished) > _count(model_dir, RESPONSES, body)


@pytest.mark.parametrize("route", [CHAT, RESPONSES])
def test_the_effort_map_rewrites_the_effort_before_thinking_follows(model_dir: Path, route: str) -> None:  # noqa: F811
    """``{"none": "low"}``: an effort of none renders as low, thinking on, as vLLM 0.33+ renders it."""
    body: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none"}
        if route == CHAT
        else {"input": "hi", "reasoning": {"effort": "none"}}
    )
    low = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"}
    assert _count(model_dir, route, body, {"none": "low"}) == _count(model_dir, CHAT, low)
    assert _count(model_dir, route, body, {"high": "max"}) != _count(
        model_dir, CHAT, low
    )  # unlisted: as sent


def test_the_recount_asks_vllm_with_the_mapped_effort() -> None:
    """``/tokenize`` has no effort field: the variables the chat route builds go as template variables."""
    body = {"messages": [], "reasoning_effort": "none"}
    asks = tokenize_bodies(CHAT, body, EngineChat(reasoning_effort_map={"none": "low"}), (0,))
    assert asks is not None
    assert asks[0]["chat_template_kwargs"] == {"reasoning_effort": "low", "enable_thinking": True}
    assert as_rendered(CHAT, body, {}) is body  # nothing to rewrite: the body itself


@pytest.mark.parametrize(
    ("effort", "mapping", "seen"),
    [("none", {"none": "low"}, "low"), ("high", {"none": "low"}, "high"), (None, {"none": "low"}, None),
     ("none", {}, "none"), (3, {"none": "low"}, 3)],
)  # fmt: skip
def test_mapped_effort(effort: Any, mapping: dict[str, str], seen: Any) -> None:
    assert mapped_effort(effort, mapping) == seen


def test_the_flag_is_checked_as_vllm_checks_it() -> None:
    """``validate_reasoning_effort_map``: an object of strings, keyed by efforts vLLM knows."""
    args = build_parser().parse_args(
        [
            "run",
            "--upstream",
            "http://127.0.0.1:8000",
            "--reasoning-effort-map",
            '{"medium": "low", "xhigh": "max"}',
        ]
    )
    assert args.reasoning_effort_map == {"medium": "low", "xhigh": "max"}
    for bad, message in (
        ("[1]", "is not a JSON object"),
        ('{"medium": 1}', "something other than a string"),
        ('{"extreme": "max"}', r"unknown efforts \['extreme'\]"),
    ):
        with pytest.raises(UsageError, match=message):
            effort_map(bad)
