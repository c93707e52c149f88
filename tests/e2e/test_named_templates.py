"""A tokenizer with named chat templates: vLLM renders a chat with tools through ``tool_use``.

Command-R's and Hermes-2-Pro's ``tokenizer_config.json`` hold a list of templates (``default``, ``tool_use``,
``rag``); checkpoints saved by recent transformers hold ``chat_template.jinja`` and
``additional_chat_templates/NAME.jinja``. vLLM 0.32.0 asks the tokenizer for its template with the chat's tools
(``resolve_chat_template`` -> transformers' ``get_chat_template``), which picks ``tool_use`` when tools reach
the template and ``default`` otherwise. The sidecar rendered ``default`` for every chat, so a tool chat's
"exact" count lacked the tools vLLM prints. Here a copy of the tiny model whose ``default`` prints no tools
and whose ``tool_use`` does (the tiny model's own template) is served by the real vLLM, and the files layout
is loaded by vLLM's own transformers. A multimodal processor's legacy ``chat_template.json`` comes before the
tokenizer's templates for chats without tools (``_try_get_processor_chat_template``): vLLM's own
``resolve_chat_template`` runs on a tiny Qwen2-VL's layouts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.chat_template import ChatTemplates
from sidecar.admission.conversation import EngineChat
from sidecar.admission.recount import tokenize_bodies
from sidecar.admission.tokens import load_counter
from tests.e2e.conftest import serve
from tests.harness.vllm import VllmServer, make_tiny_model, vision_path

pytestmark = pytest.mark.e2e

DEFAULT = (
    "{{ note }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
RAG = "{% for message in messages %}[doc] {{ message['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def named_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its templates named in ``tokenizer_config.json``: tools printed by ``tool_use`` only."""
    model = tmp_path_factory.mktemp("named") / "named-templates"
    shutil.copytree(tiny_model, model)
    tool_use = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").unlink()  # a file would take priority over the config's list
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": DEFAULT},
        {"name": "tool_use", "template": tool_use},
        {"name": "rag", "template": RAG},
    ]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def named_server(
    vllm_env: Path, named_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    yield from serve(vllm_env, named_model, tmp_path_factory, "vllm-named-templates.log")


WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
ASKED = {"role": "user", "content": "what is the weather"}
CHATS: dict[str, dict[str, Any]] = {  # tools go with tool_choice "none": the server has no tool parser
    # (an empty tool list would choose tool_use too, but vLLM's chat route refuses it: 400, "must not be empty")
    "no tools": {"messages": [ASKED]},
    "a tool": {"messages": [ASKED], "tools": [WEATHER], "tool_choice": "none"},
    "a variable set": {"messages": [ASKED], "chat_template_kwargs": {"note": "be brief"}},
    "a variable set to null": {
        "messages": [ASKED],
        "chat_template_kwargs": {"note": None},
    },  # unset, not "None"
    "tools as a template variable": {"messages": [ASKED], "chat_template_kwargs": {"tools": [WEATHER]}},
    "a developer message and two tools": {
        "messages": [{"role": "developer", "content": "be terse"}, ASKED],
        "tools": [WEATHER, WEATHER],
        "tool_choice": "none",
    },
}


async def test_a_chat_with_tools_counts_as_vllms_tool_use_template_renders_it(
    named_server: VllmServer, named_model: Path
) -> None:
    counter = load_counter(str(named_model))
    counts: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:
        for name, chat in CHATS.items():
            body = {"model": "tiny", "max_tokens": 1, **chat}
            async with session.post(named_server.url + "/v1/chat/completions", json=body) as response:
                payload = await response.json()
            assert response.status == 200, (name, payload)
            facts = request_facts("/v1/chat/completions", body, counter)
            assert facts.exact, name
            assert facts.prompts == (payload["usage"]["prompt_tokens"],), name
            counts[name] = facts.prompts[0]
            asks = tokenize_bodies("/v1/chat/completions", body, EngineChat(), (0,))  # as recount.py asks
            assert asks is not None
            async with session.post(named_server.url + "/tokenize", json=asks[0]) as response:
                assert (await response.json())["count"] == counts[name], name
    assert counts["a tool"] > counts["no tools"] + 10  # the tool's JSON: tool_use, not default
    assert counts["a variable set to null"] == counts["no tools"]
    assert counts["tools as a template variable"] > counts["no tools"] + 10  # tool_use, the tool as sent


PROBE = """
import json, sys
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
picked = {}
for name, tools in (("none", None), ("empty", []), ("one", [{"type": "function"}])):
    try:
        picked[name] = tokenizer.get_chat_template(None, tools=tools)
    except ValueError:
        picked[name] = None
print(json.dumps(picked))
"""

LAYOUTS: dict[str, dict[str, str]] = {
    "a default file and a named one": {"chat_template.jinja": "D", "additional_chat_templates/tool_use.jinja": "U"},
    "named files only": {"additional_chat_templates/tool_use.jinja": "U", "additional_chat_templates/rag.jinja": "R"},
    "a lone default file over the config's list": {"chat_template.jinja": "D"},
}  # fmt: skip


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_template_files_are_chosen_as_vllms_transformers_chooses_them(
    vllm_env: Path, tiny_model: Path, tmp_path: Path, layout: str
) -> None:
    """vLLM's transformers (5.19 beside vLLM 0.32.0) loads each layout; the sidecar chooses the same text."""
    model = tmp_path / "layout"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(tiny_model / name, model / name)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": "C"}, {"name": "tool_use", "template": "CU"}]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in LAYOUTS[layout].items():
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_text(text)
    result = subprocess.run(
        [str(vllm_env), "-c", PROBE, str(model)], capture_output=True, text=True, check=True, timeout=120
    )
    vllms = json.loads(result.stdout.strip().splitlines()[-1])
    templates = ChatTemplates.load(model)
    assert templates is not None
    ours = {
        name: None if (chosen := templates.chosen(tools)) is None else chosen.source
        for name, tools in (("none", None), ("empty", []), ("one", [{"type": "function"}]))
    }
    assert ours == vllms


RESOLVE = """
import json, sys
from types import SimpleNamespace
from vllm.renderers.hf import resolve_chat_template
from vllm.tokenizers import get_tokenizer
chosen = {}
for path in sys.argv[1:]:
    config = SimpleNamespace(tokenizer_revision=None, code_revision=None, tokenizer=path, model=path,
                             trust_remote_code=False, hf_config=SimpleNamespace(model_type="qwen2_vl"))
    tokenizer = get_tokenizer(path)
    chosen[path] = [resolve_chat_template(tokenizer, None, tools, model_config=config)
                    for tools in (None, [{"type": "function"}])]
print(json.dumps(chosen))
"""

VL_LAYOUTS: dict[str, dict[str, str]] = {
    "a legacy processor template beside the tokenizer's": {"chat_template.json": json.dumps({"chat_template": "P"})},
    "a legacy processor template and named files": {
        "chat_template.json": json.dumps({"chat_template": "P"}), "additional_chat_templates/rag.jinja": "R"},
    "no legacy file": {},
}  # fmt: skip


def test_a_processors_template_is_chosen_as_vllm_chooses_it(
    vllm_env: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """vLLM 0.32.0's ``resolve_chat_template`` on a tiny Qwen2-VL's layouts: the sidecar chooses the same text."""
    made = make_tiny_model(vllm_env, tmp_path_factory.mktemp("vl") / "tiny-vl", vl=True)
    folders = []
    for index, files in enumerate(VL_LAYOUTS.values()):
        folder = tmp_path_factory.mktemp(f"layout{index}") / "vl"
        shutil.copytree(made, folder)
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
        folders.append(folder)
    result = subprocess.run(
        [str(vllm_env), "-c", RESOLVE, *map(str, folders)], capture_output=True, text=True, check=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(vision_path()), "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    vllms = json.loads(result.stdout.strip().splitlines()[-1])
    for folder in folders:
        templates = ChatTemplates.load(folder)
        assert templates is not None
        ours = [
            None if (t := templates.chosen(tools)) is None else t.source
            for tools in (None, [{"type": "function"}])
        ]
        assert ours == vllms[str(folder)], folder
    assert vllms[str(folders[0])][0] == "P"  # the case that differs from the tokenizer's
