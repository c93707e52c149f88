"""The body's coercion against pydantic's lax mode (what vLLM's request models use), and chat templates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from sidecar.admission.body import COMPLETIONS_DEFAULT_MAX_TOKENS, coerce_bool, coerce_int, request_facts
from sidecar.admission.chat_template import ChatTemplates
from sidecar.admission.tokens import EstimatingCounter, TokenizerCounter, load_counter


class _Ints(pydantic.BaseModel):
    value: int


class _Bools(pydantic.BaseModel):
    value: bool


def _pydantic(model: type[pydantic.BaseModel], value: Any) -> Any:
    try:
        return model.model_validate({"value": value}).value  # type: ignore[attr-defined]
    except pydantic.ValidationError:
        return "refused"


def _ours(coerce: Any, value: Any) -> Any:
    try:
        return coerce(value)
    except ValueError:
        return "refused"


NUMBER_TEXT = st.from_regex(r"\A\s?[+-]?[0-9_]{0,6}(\.[0-9]{0,3})?\s?\Z", fullmatch=True)
JSON_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.floats(min_value=-1e6, max_value=1e6).map(round).map(float)
    | NUMBER_TEXT
    | st.tuples(st.sampled_from(["", " ", "\x85", "\x1f", "\u3000", "\t"]), NUMBER_TEXT).map("".join)
    | st.text(max_size=6)
    | st.lists(st.integers(), max_size=2)
)


@given(JSON_VALUES)
@example("0__0")  # pydantic-core strips leading zeros and underscores before it reads the digits
@example("0__1_2")
@example("0_")
@example("1__2")
@example("-0__1")
def test_integers_are_coerced_exactly_as_pydantic_does(value: Any) -> None:
    assert _ours(coerce_int, value) == _pydantic(_Ints, value)


@given(
    JSON_VALUES | st.sampled_from(["yes", "no", "on", "off", "t", "f", "y", "n", "TRUE", " 1 ", 1.0, 0.0, 2])
)
def test_booleans_are_coerced_exactly_as_pydantic_does(value: Any) -> None:
    assert _ours(coerce_bool, value) == _pydantic(_Bools, value)


# -- chat templates ---------------------------------------------------------------------------------

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory with a small trained BPE tokenizer and a ChatML template (made here, offline)."""
    directory = tmp_path_factory.mktemp("chat-model")
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(
        ["the KV cache grows with every token of every sequence"] * 20, trainer=trainer
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"chat_template": CHATML, "eos_token": "<|endoftext|>", "bos_token": None}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the KV cache grows"}]


def test_chat_prompts_are_counted_by_rendering_the_models_template(model_dir: Path) -> None:
    counter = load_counter(str(model_dir))
    assert isinstance(counter, TokenizerCounter)
    rendered = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in MESSAGES)
    rendered += "<|im_start|>assistant\n"
    expected = len(
        Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(rendered, add_special_tokens=False).ids
    )
    facts = request_facts("/v1/chat/completions", {"messages": MESSAGES, "model": "m"}, counter)
    assert (facts.prompts, facts.exact) == ((expected,), True)
    assert facts.prompt_ids is not None
    assert len(facts.prompt_ids[0]) == expected
    without = request_facts(
        "/v1/chat/completions", {"messages": MESSAGES, "add_generation_prompt": False}, counter
    )
    assert without.prompts[0] < expected  # the assistant header is not added


def test_a_template_that_cannot_render_falls_back_to_the_estimate(tmp_path: Path, model_dir: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ raise_exception('no') }}"})
    )
    facts = request_facts("/v1/chat/completions", {"messages": MESSAGES}, load_counter(str(tmp_path)))
    assert not facts.exact  # an estimate: it can never cause a 400
    custom = request_facts(
        "/v1/chat/completions",
        {"messages": MESSAGES, "chat_template": "{{ x }}"},
        load_counter(str(model_dir)),
    )
    assert not custom.exact  # a request's own template is not rendered here


def test_named_templates_and_jinja_files(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}
        )
    )
    template = ChatTemplates.load(tmp_path)
    assert template is not None
    assert template.render([], None, add_generation_prompt=True, extra=None) == "D"
    (tmp_path / "chat_template.jinja").write_text("J{{ messages | length }}")
    file_template = ChatTemplates.load(tmp_path)
    assert file_template is not None
    assert (
        file_template.render([{"role": "user", "content": "x"}], None, add_generation_prompt=True, extra=None)
        == "J1"
    )


def test_the_estimate_never_renders() -> None:
    facts = request_facts("/v1/completions", {"prompt": "abcd"}, EstimatingCounter())
    assert (facts.exact, facts.max_output_tokens) == (False, COMPLETIONS_DEFAULT_MAX_TOKENS)
