"""The chat template's variables as vLLM 0.32 builds them, and a final message left open to continue.

``ChatCompletionRequest.build_chat_params`` merges the request's ``continue_final_message``, ``documents`` and
``reasoning_effort`` (with ``enable_thinking``) over the client's ``chat_template_kwargs``; transformers cuts a
continued message's rendering where its text ends. The sidecar passed only ``chat_template_kwargs`` and
counted the closing tokens of a continued message, so an exact count could exceed vLLM's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from sidecar.admission.body import request_facts
from sidecar.admission.conversation import template_kwargs
from sidecar.admission.tokens import load_counter
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

ROUTE = "/v1/chat/completions"
OPEN = [{"role": "user", "content": "the KV cache"}, {"role": "assistant", "content": "grows with every"}]


@pytest.mark.parametrize(
    ("body", "variables"),
    [
        ({}, {}),
        (
            {"chat_template_kwargs": {"enable_thinking": False, "add_generation_prompt": False}},
            {"enable_thinking": False},
        ),
        ({"reasoning_effort": "high"}, {"reasoning_effort": "high", "enable_thinking": True}),
        ({"reasoning_effort": "none"}, {"reasoning_effort": "none", "enable_thinking": False}),
        (
            {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}},
            {"reasoning_effort": "low", "enable_thinking": False},  # the client's own choice stands
        ),
        ({"reasoning_effort": "auto"}, {"enable_thinking": True}),  # "auto" is unset to merge_kwargs
        ({"chat_template_kwargs": {"continue_final_message": True}}, {}),  # the request's default False wins
        (
            {"continue_final_message": True, "documents": [{"text": "x"}]},
            {"continue_final_message": True, "documents": [{"text": "x"}]},
        ),
        (
            {"chat_template_kwargs": {"documents": ["a"]}, "documents": ["b"]},
            {"documents": ["b"]},
        ),  # the field wins
    ],
)
def test_the_templates_variables_merge_as_vllms(body: dict[str, Any], variables: dict[str, Any]) -> None:
    assert template_kwargs(body) == variables


@pytest.mark.parametrize("final", ["grows with every", [{"type": "text", "text": "grows with every"}]])
def test_a_continued_message_is_counted_up_to_its_text(model_dir: Path, final: Any) -> None:  # noqa: F811
    counter = load_counter(str(model_dir))
    messages = [OPEN[0], {"role": "assistant", "content": final}]
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False}
    facts = request_facts(ROUTE, body, counter)
    text = (
        "<|im_start|>user\nthe KV cache<|im_end|>\n<|im_start|>assistant\ngrows with every"  # no <|im_end|>
    )
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert facts.exact
    assert facts.prompts == (len(tokenizer.encode(text, add_special_tokens=False).ids),)
    closed = request_facts(ROUTE, {"messages": messages, "add_generation_prompt": False}, counter)
    assert closed.prompts[0] > facts.prompts[0]


def test_a_template_that_drops_the_final_message_falls_back_to_the_estimate(
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    template = "{% for m in messages[:-1] %}{{ m['content'] }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    body = {"messages": OPEN, "continue_final_message": True, "add_generation_prompt": False}
    assert not request_facts(
        ROUTE, body, load_counter(str(tmp_path))
    ).exact  # vLLM refuses it: never a 400 here


def test_the_responses_instructions_lead_as_a_system_message(model_dir: Path) -> None:  # noqa: F811
    """vLLM's ``construct_input_messages`` puts ``instructions`` first; the sidecar counted ``input`` alone."""
    counter = load_counter(str(model_dir))
    responses = request_facts("/v1/responses", {"input": "the KV cache", "instructions": "be brief"}, counter)
    chat = request_facts(
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "the KV cache"},
            ]
        },
        counter,
    )
    assert (responses.prompts, responses.prompt_ids, responses.exact) == (chat.prompts, chat.prompt_ids, True)


@pytest.mark.parametrize(
    "field", [{"previous_response_id": "resp_1"}, {"previous_input_messages": [{"x": 1}]}]
)
def test_a_stored_conversation_is_an_item_only_usage_tells(model_dir: Path, field: dict[str, Any]) -> None:  # noqa: F811
    facts = request_facts("/v1/responses", {"input": "the KV cache", **field}, load_counter(str(model_dir)))
    assert (facts.exact, facts.prompt_ids, facts.media_items) == (False, None, 1)


def test_a_harmony_models_chats_are_rendered_but_never_exact(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    """vLLM 0.32 renders gpt-oss chats with openai_harmony (``is_harmony`` when ``model_type`` is ``gpt_oss``,
    ``online_renderer.py``), not with the checkpoint's template: the sidecar's rendering may differ from vLLM's."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((model_dir / name).read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    body = {"messages": OPEN}
    harmony = request_facts(ROUTE, body, load_counter(str(tmp_path)))
    plain = request_facts(ROUTE, body, load_counter(str(model_dir)))
    assert (harmony.exact, plain.exact) == (False, True)
    assert (harmony.prompts, harmony.prompt_ids) == (
        plain.prompts,
        plain.prompt_ids,
    )  # near; blocks still shared
