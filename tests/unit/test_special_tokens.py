"""``add_special_tokens`` as vLLM 0.32 applies it: on by default for completions, off for chats.

A completion's text prompt is tokenized with the tokenizer's post-processor (``CompletionRequest.
add_special_tokens`` defaults to true: a Llama-3 prompt gains ``<|begin_of_text|>``); a chat's rendered
template is not (``ChatCompletionRequest.add_special_tokens`` defaults to false), a Responses request's is
(``ResponsesRequest.build_tok_params`` keeps ``TokenizeParams``' default, true); token ids are taken as given.
The sidecar never added them, so its exact count of a completion was one short on such tokenizers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, processors

from sidecar.admission.body import request_facts
from sidecar.admission.tokens import load_counter
from tests.unit.test_body_parity import CHATML, model_dir  # noqa: F401 - the fixture

TEXT = "the KV cache grows"


@pytest.fixture(scope="module")
def bos_model(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The fixture's tokenizer with a post-processor that puts ``<|endoftext|>`` first, as Llama's puts BOS."""
    directory = tmp_path_factory.mktemp("bos-model")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    return directory


@pytest.mark.parametrize(
    ("route", "body", "bos"),
    [
        ("/v1/completions", {"prompt": TEXT}, 1),
        ("/v1/completions", {"prompt": [TEXT, TEXT]}, 1),
        ("/v1/completions", {"prompt": TEXT, "add_special_tokens": False}, 0),
        ("/v1/completions", {"prompt": TEXT, "add_special_tokens": "false"}, 0),  # pydantic's lax bool
        ("/v1/completions", {"prompt": [1, 2, 3]}, 0),  # ids are the engine's as given
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT}]}, 0),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": TEXT}], "add_special_tokens": True},
            1,
        ),
        ("/v1/responses", {"input": TEXT}, 1),  # build_tok_params leaves TokenizeParams' default, true
        ("/v1/responses", {"input": TEXT, "add_special_tokens": False}, 1),  # not a Responses field
    ],
)
def test_special_tokens_are_added_where_vllm_adds_them(
    bos_model: Path,
    model_dir: Path,  # noqa: F811
    route: str,
    body: dict[str, Any],
    bos: int,
) -> None:
    with_bos = request_facts(route, body, load_counter(str(bos_model)))
    without = request_facts(route, body, load_counter(str(model_dir)))
    assert with_bos.exact
    assert with_bos.prompts == tuple(count + bos for count in without.prompts)
    assert with_bos.prompt_ids is not None
    assert all(ids[:1] == (0,) for ids in with_bos.prompt_ids) is (bos == 1)
