"""Where vLLM adds a tokenizer's special tokens, on a tokenizer that adds a BOS as Llama-3's does.

vLLM 0.32 tokenizes a completion's text with them (``CompletionRequest.add_special_tokens``, default true), a
chat's rendered template without (``ChatCompletionRequest.add_special_tokens``, default false), and a Responses
request's rendered template with them: ``ResponsesRequest.build_tok_params`` passes no such field, so
``TokenizeParams``' default, true, holds, and the request has no field to turn it off. The sidecar counted a
Responses prompt like a chat's, one token short here (18 where vLLM builds 19), which its count audit reads as
a disagreement that ends exact counting on the route.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tokenizers import Tokenizer, processors

from sidecar.admission.body import request_facts
from sidecar.admission.tokens import load_counter
from tests.e2e.conftest import serve
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e

BOS = "<|endoftext|>"


@pytest.fixture(scope="module")
def bos_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model whose tokenizer puts ``<|endoftext|>`` first, as Llama-3's puts ``<|begin_of_text|>``."""
    directory = tmp_path_factory.mktemp("bos") / "tiny-bos"
    shutil.copytree(tiny_model, directory)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def bos_server(
    vllm_env: Path, bos_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    yield from serve(vllm_env, bos_model, tmp_path_factory, "vllm-bos.log")


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/completions", {"prompt": "the KV cache", "max_tokens": 1}, "prompt_tokens"),
    (
        "/v1/completions",
        {"prompt": "the KV cache", "max_tokens": 1, "add_special_tokens": False},
        "prompt_tokens",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        "prompt_tokens",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "add_special_tokens": True},
        "prompt_tokens",
    ),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 1}, "input_tokens"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 1, "add_special_tokens": False}, "input_tokens"),
    ("/v1/responses", {"input": "hi", "instructions": "be brief", "max_output_tokens": 1}, "input_tokens"),
]


async def test_counts_add_special_tokens_where_vllm_adds_them(
    bos_server: VllmServer, bos_model: Path
) -> None:
    counter = load_counter(str(bos_model))
    disagree, served_counts = [], []
    async with aiohttp.ClientSession() as session:
        for route, body, field in CASES:
            async with session.post(bos_server.url + route, json={"model": "tiny", **body}) as response:
                assert response.status == 200, (route, body)
                served = int((await response.json())["usage"][field])
            served_counts.append(served)
            facts = request_facts(route, body, counter)
            if not facts.exact or facts.prompts != (served,):
                disagree.append((route, body, facts.prompts, served))
    assert not disagree
    assert (
        served_counts[0] == served_counts[1] + 1
    )  # the tokenizer does add its BOS: the cases test something
    assert served_counts[4] == served_counts[2] + 1
