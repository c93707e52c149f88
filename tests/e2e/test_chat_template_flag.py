"""vLLM started with its chat flags (template, content format, default variables); the sidecar told the same.

vLLM renders chats with the template it is given, not the model's, hands a template of the ``openai``
content format a list of text parts even where the template prints ``message['content']`` whole, and fills
the variables a request leaves unset from ``--default-chat-template-kwargs``. The sidecar read only the
model's template, so its "exact" counts were another template's. Told the same flags (``kv-sidecar run
--chat-template FILE --chat-template-content-format openai --default-chat-template-kwargs JSON``), its counts
are vLLM's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.conversation import EngineChat
from sidecar.admission.tokens import load_counter
from sidecar.flags import read_chat_template
from tests.e2e.conftest import serve
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e

TEMPLATE = (
    "{% if greeting %}{{ greeting }}\n{% endif %}"
    "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)  # prints content whole: a list of parts under the openai format, as Python prints it


@pytest.fixture(scope="module")
def template_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "plain.jinja"
    path.write_text(TEMPLATE)
    return path


@pytest.fixture(scope="module")
def templated_server(
    vllm_env: Path, tiny_model: Path, template_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    flags = (
        "--chat-template", str(template_file), "--chat-template-content-format", "openai",
        "--default-chat-template-kwargs", json.dumps(DEFAULTS),
    )  # fmt: skip
    yield from serve(vllm_env, tiny_model, tmp_path_factory, "vllm-chat-template.log", flags)


DEFAULTS = {"greeting": "the server's own greeting, in every prompt"}
CHATS = [
    [{"role": "user", "content": "hi there"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the KV cache grows"}],
    [{"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}]}],
    [{"role": "user", "content": "hi there"}],
    [{"role": "user", "content": "hi there"}],
]
VARIABLES: list[dict[str, object]] = [
    {},
    {"chat_template_kwargs": {"greeting": "a request's own"}},  # the request's wins
    {},
    {"chat_template_kwargs": {"greeting": None}},  # None leaves the default (merge_kwargs)
    {"chat_template_kwargs": {"greeting": ""}},  # an empty one is set: no greeting
]


async def test_counts_follow_the_template_and_format_vllm_is_told(
    templated_server: VllmServer, tiny_model: Path, template_file: Path
) -> None:
    template = read_chat_template(str(template_file))
    told = load_counter(
        str(tiny_model),
        EngineChat(template=template, content_format="openai", default_template_kwargs=DEFAULTS),
    )
    untold = load_counter(str(tiny_model))  # the model's own template, the format it implies
    async with aiohttp.ClientSession() as session:
        for messages, variables in zip(CHATS, VARIABLES, strict=True):
            body = {"model": "tiny", "messages": messages, "max_tokens": 1, **variables}
            async with session.post(templated_server.url + "/v1/chat/completions", json=body) as response:
                assert response.status == 200
                served = (await response.json())["usage"]["prompt_tokens"]
            facts = request_facts("/v1/chat/completions", body, told)
            assert facts.exact
            assert facts.prompts == (served,), body
            assert request_facts("/v1/chat/completions", body, untold).prompts != (served,)
