"""Token counting (the estimator against the real Qwen3 tokenizer) and request-body parsing."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sidecar.admission.body import CHAT_MESSAGE_OVERHEAD, decode_json_body, request_facts
from sidecar.admission.outcomes import Reason, RefusedError
from sidecar.admission.tokens import EstimatingCounter

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("abcd", 1), ("abcde", 2), ("2026", 4), ("中文", 2), ("中文abcd", 3), ("ｆｕｌｌ", 4)],
)
def test_estimator_rules(text: str, tokens: int) -> None:
    assert EstimatingCounter().count(text) == tokens


@given(st.text(max_size=200))
def test_estimator_never_fails_and_is_bounded(text: str) -> None:
    count = EstimatingCounter().count(text)
    assert 0 <= count <= len(text.encode("utf-8"))


COUNTER = EstimatingCounter()


@pytest.mark.parametrize(
    ("path", "body", "prompt", "output", "exact", "choices"),
    [
        ("/v1/completions", {"prompt": "abcdefgh"}, 2, 16, False, 1),
        ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5}, 3, 5, True, 1),
        ("/v1/completions", {"prompt": [[1, 2], [3]], "max_tokens": 5, "n": 2}, 2, 5, True, 2),  # the largest
        ("/v1/completions", {"prompt": ["abcd", "efgh"]}, 1, 16, False, 1),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "abcd"}]}, 1 + CHAT_MESSAGE_OVERHEAD, None, False, 1),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "abcd"}]}], "max_completion_tokens": 7,
             "max_tokens": 9},
            1 + CHAT_MESSAGE_OVERHEAD, 7, False, 1,
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}], "max_tokens": 9}, CHAT_MESSAGE_OVERHEAD, 9, False, 1),
        ("/v1/responses", {"input": "abcd", "max_output_tokens": 3}, 1 + CHAT_MESSAGE_OVERHEAD, 3, False, 1),
    ],
)  # fmt: skip
def test_request_facts(
    path: str, body: dict[str, object], prompt: int, output: int | None, exact: bool, choices: int
) -> None:
    facts = request_facts(path, body, COUNTER)
    assert (facts.prompt_tokens, facts.max_output_tokens, facts.exact, facts.choices) == (
        prompt,
        output,
        exact,
        choices,
    )


def test_batches_are_prompts_of_their_own() -> None:
    facts = request_facts(
        "/v1/completions", {"prompt": [[1] * 100, [2] * 30], "max_tokens": 50, "n": 3}, COUNTER
    )
    assert (facts.prompts, facts.choices, facts.sequences) == ((100, 30), 3, 6)
    assert facts.prompt_ids == ((1,) * 100, (2,) * 30)
    texts = request_facts("/v1/completions", {"prompt": ["abcd", "abcdefgh"]}, COUNTER)
    assert (texts.prompts, texts.exact, texts.prompt_ids) == ((1, 2), False, None)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_tokens", "8", 8), ("max_tokens", 8.0, 8), ("max_tokens", True, 1), ("max_tokens", " 8 ", 8),
        ("max_tokens", "8.0", 8), ("max_tokens", "1_000", 1000), ("max_tokens", None, 16), ("n", "2", 2),
        ("n", 2.0, 2), ("best_of", 3, 1), ("best_of", "x", 1),  # best_of: an unknown field in vLLM 0.32
    ],
)  # fmt: skip
def test_numbers_are_coerced_as_vllm_coerces_them(field: str, value: object, expected: int) -> None:
    facts = request_facts("/v1/completions", {"prompt": [1, 2], field: value}, COUNTER)
    assert (facts.max_output_tokens if field == "max_tokens" else facts.choices) == expected


def test_vllm_extensions_are_read() -> None:
    facts = request_facts(
        "/v1/completions",
        {"prompt": [1], "ignore_eos": "true", "min_tokens": 4, "stream": 1, "model": "m", "priority": "2"},
        COUNTER,
    )
    assert (facts.ignore_eos, facts.min_output_tokens, facts.stream, facts.model, facts.priority) == (
        True, 4, True, "m", 2,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/completions", {}, "'prompt' is required"),
        ("/v1/completions", {"prompt": {"a": 1}}, "'prompt' must be"),
        ("/v1/completions", {"prompt": [1, "a", 2.5]}, "'prompt' must be"),
        ("/v1/completions", {"prompt": "x", "max_tokens": "five"}, "'max_tokens' must be"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}, "'max_tokens' must be"),
        ("/v1/completions", {"prompt": "x", "max_tokens": [8]}, "'max_tokens' must be"),
        ("/v1/completions", {"prompt": "x", "stream": "maybe"}, "'stream' must be"),
        ("/v1/chat/completions", {}, "'messages' is required"),
        ("/v1/chat/completions", {"messages": []}, "non-empty list"),
        ("/v1/chat/completions", {"messages": ["hi"]}, "must be an object"),
        ("/v1/chat/completions", {"messages": [{"content": 5}]}, "'content' must be"),
    ],
)
def test_bad_bodies(path: str, body: dict[str, object], message: str) -> None:
    with pytest.raises(RefusedError, match=message) as info:
        request_facts(path, body, COUNTER)
    assert info.value.reason is Reason.INVALID_REQUEST


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xc3\x28", "not valid UTF-8"),
        (b"{", "not valid JSON"),
        (b"[]", "JSON object"),
        (b"[" * 50_000, "too deeply"),
    ],
)
def test_decode_json_body(raw: bytes, message: str) -> None:
    with pytest.raises(RefusedError, match=message):
        decode_json_body(raw)


@given(st.binary(max_size=300))
def test_fuzz_body_decoding_raises_only_refusals(raw: bytes) -> None:
    try:
        body = decode_json_body(raw)
        request_facts("/v1/chat/completions", body, COUNTER)
    except RefusedError:
        pass


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=20,
    )
)
@example({"type": []})  # an Anthropic content block whose type is a list: a TypeError until 2026-12-06
def test_fuzz_json_shapes_raise_only_refusals(value: object) -> None:
    fields = (
        "prompt", "messages", "input", "max_tokens", "n", "system", "tools", "prompt_embeds", "suffix",
        "cache_salt", "stream_interval", "continue_final_message", "documents", "reasoning_effort",
        "chat_template_kwargs", "add_special_tokens",
    )  # fmt: skip
    routes = (
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/responses",
        "/v1/messages",
    )
    chat = [{"role": "user", "content": "hi"}]
    for path in routes:
        for body in (
            dict.fromkeys(fields, value),
            {"prompt": "hi", "messages": [chat] if path.endswith("batch") else chat, "input": "hi"}
            | {field: value for field in fields[3:]},
        ):
            with contextlib.suppress(RefusedError):
                request_facts(path, decode_json_body(json.dumps(body).encode()), COUNTER)
