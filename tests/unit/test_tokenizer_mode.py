"""Exact counts only where vLLM's tokenizer mode uses the model's tokenizer.json and Jinja template.

vLLM 0.32 renders DeepSeek-V3.2/V4 chats with Python encoders, Mistral checkpoints (``consolidated*.safetensors``
beside ``tekken.json``) with mistral_common, and any model with the mode it is told (``--tokenizer-mode``).
The sidecar called every count from ``tokenizer.json`` exact but gpt-oss chats, so a chat vLLM builds another
way could be refused or planned on the template's count. vLLM's own rule for Mistral files is run in
``tests/e2e/test_named_templates.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.conversation import EngineChat
from sidecar.admission.tokenizer_mode import EngineTokenizing, resolved_mode
from sidecar.admission.tokens import counts_described, load_counter
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
MISTRAL_FILES = ["config.json", "consolidated.safetensors", "tekken.json", "tokenizer.json"]


@pytest.mark.parametrize(
    ("told", "config", "files", "mode", "texts", "chats"),
    [
        ("auto", LLAMA, ["tokenizer.json"], "hf", True, True),
        ("auto", {"architectures": ["DeepseekV32ForCausalLM"]}, [], "deepseek_v32", True, False),
        ("auto", {"architectures": ["DeepseekV4ForConditionalGeneration"]}, [], "deepseek_v4", True, False),
        ("auto", {"architectures": ["KimiK3ForConditionalGeneration"]}, [], "kimi_k3", True, False),
        ("auto", {"architectures": ["MoonshotKimiaForCausalLM"]}, [], "kimi_audio", False, False),
        ("auto", LLAMA, MISTRAL_FILES, "mistral", False, False),
        ("auto", LLAMA, ["consolidated-00001-of-00002.safetensors", "tokenizer.model.v3"], "mistral", False, False),
        ("auto", LLAMA, ["tekken.json", "model.safetensors"], "hf", True, True),  # no consolidated weights
        ("auto", LLAMA, ["consolidated.safetensors", "tokenizer.json"], "hf", True, True),  # no Mistral tokenizer
        ("hf", LLAMA, MISTRAL_FILES, "hf", True, True),  # told: as vLLM is told
        ("hf", {"model_type": "gpt_oss"}, [], "hf", True, False),  # Harmony
        ("cohere", LLAMA, [], "cohere", True, False),  # cohere_melody renders
        ("some_plugin", LLAMA, [], "some_plugin", False, False),  # unknown: neither
    ],
)  # fmt: skip
def test_the_mode_and_what_it_leaves_exact(
    told: str, config: dict[str, Any], files: list[str], mode: str, texts: bool, chats: bool
) -> None:
    assert resolved_mode(told, config, files) == mode
    tokenizing = EngineTokenizing.of(told, config, files)
    assert (tokenizing.texts_exact, tokenizing.chats_exact) == (texts, chats)


CHAT = {"messages": [{"role": "user", "content": "the KV cache grows"}]}
TEXT = {"prompt": "the KV cache grows"}


def _copy(source: Path, target: Path, config: dict[str, Any], *extra: str) -> Path:
    target.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (target / name).write_bytes((source / name).read_bytes())
    (target / "config.json").write_text(json.dumps(config))
    for name in extra:
        (target / name).write_text("{}")
    return target


@pytest.mark.parametrize(
    ("config", "extra", "told", "text_exact", "chat_exact"),
    [
        (LLAMA, (), "auto", True, True),
        (LLAMA, ("consolidated.safetensors", "tekken.json"), "auto", False, False),
        (LLAMA, ("consolidated.safetensors", "tekken.json"), "hf", True, True),
        ({"architectures": ["DeepseekV32ForCausalLM"]}, (), "auto", True, False),
        (LLAMA, (), "deepseek_v4", True, False),
    ],
)
def test_counts_are_exact_only_where_vllm_counts_alike(
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
    config: dict[str, Any],
    extra: tuple[str, ...],
    told: str,
    text_exact: bool,
    chat_exact: bool,
) -> None:
    directory = _copy(model_dir, tmp_path / "model", config, *extra)
    counter = load_counter(str(directory), EngineChat(tokenizer_mode=told))
    text = request_facts("/v1/completions", TEXT, counter)
    chat = request_facts("/v1/chat/completions", CHAT, counter)
    assert (text.exact, chat.exact) == (text_exact, chat_exact)
    exact = request_facts("/v1/completions", TEXT, load_counter(str(model_dir)))
    assert text.prompts == exact.prompts  # the tokenizer still counts: near, never a 400 on it


def test_the_start_up_line_says_what_is_exact(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    """``kv-sidecar run`` logs ``prompt_counts`` with this: a user sees why counts are near."""
    directory = _copy(model_dir, tmp_path / "model", {"architectures": ["DeepseekV32ForCausalLM"]})
    assert counts_described(load_counter(str(directory))) == {
        "counter": "tokenizer", "texts_exact": True, "chats_exact": False, "tokenizer_mode": "deepseek_v32",
    }  # fmt: skip
    assert counts_described(load_counter(None)) == {
        "counter": "estimate", "texts_exact": False, "chats_exact": False, "tokenizer_mode": None,
    }  # fmt: skip
