"""vLLM's ``--tokenizer``: prompts counted with that tokenizer's files, the served model's architecture beside.

vLLM 0.32.0 and 0.34.0 load the tokenizer, its chat templates and a processor's template from ``--tokenizer``
(default ``--model``) at ``--tokenizer-revision`` (default ``--revision``), and read the Mistral files there
(``ModelConfig.__post_init__``, ``resolve_chat_template``, ``resolve_tokenizer_args``); the architecture that
picks a mode (DeepSeek-V3.2, ...) is the served model's. The sidecar read ``--model``'s folder only, so a
deployment with its own tokenizer was counted with another template and called exact. The real server with
``--tokenizer`` is in ``tests/e2e/test_separate_tokenizer.py``.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import constants

from sidecar.admission.body import request_facts
from sidecar.admission.conversation import EngineChat
from sidecar.admission.count_audit import CountAudit
from sidecar.admission.tokens import load_counter
from sidecar.budget.hub import resolve_tokenizer, tokenizer_folder
from sidecar.errors import ConfigError, ModelUnavailableError
from sidecar.logs import make_logger
from sidecar.server.counting import CountingFiles, PromptCounting, separate_tokenizer
from tests.hf_cache import add_model
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

PREAMBLE = "{{ 'You are a tiny model that answers in haiku, always, with care.\\n' }}"
CHAT = {"messages": [{"role": "user", "content": "the KV cache grows"}]}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}


def tokenizer_files(model: Path, template: str) -> dict[str, Any]:
    """A tokenizer repository's files: ``model``'s tokenizer with ``template`` as its chat template."""
    files: dict[str, Any] = {
        name: (model / name).read_text() for name in ("tokenizer.json", "tokenizer_config.json")
    }
    config = json.loads(files["tokenizer_config.json"])
    config.pop("chat_template", None)
    files["tokenizer_config.json"] = config
    files["chat_template.jinja"] = template
    return files


def model_template(model: Path) -> str:
    """``model``'s own chat template (its ``tokenizer_config.json``'s)."""
    return str(json.loads((model / "tokenizer_config.json").read_text())["chat_template"])


def served_model(model: Path, folder: Path, config: dict[str, Any]) -> Path:
    """The served model's folder: ``model``'s tokenizer and template, ``config`` as its ``config.json``."""
    folder.mkdir()
    for entry in model.iterdir():
        if entry.is_file():
            (folder / entry.name).write_bytes(entry.read_bytes())
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_tokenizer_repository_without_config_json_resolves_from_the_cache(tmp_path: Path) -> None:
    """vLLM needs no ``config.json`` in a ``--tokenizer`` repository; ``--model``'s resolution demands one."""
    snapshot = add_model(tmp_path, "acme/tok", {"tokenizer.json": "{}", "chat_template.jinja": "x"})
    assert tokenizer_folder("acme/tok", cache_dir=tmp_path, offline=True) == snapshot
    assert resolve_tokenizer("acme/tok", cache_dir=tmp_path, offline=True) == snapshot


def test_the_tokenizer_revision_selects_the_snapshot(tmp_path: Path) -> None:
    add_model(tmp_path, "acme/tok", {"tokenizer.json": "{}"})
    other = add_model(
        tmp_path, "acme/tok", {"tokenizer.json": "{}", "chat_template.jinja": "v2"}, branch="v2"
    )
    assert tokenizer_folder("acme/tok", "v2", cache_dir=tmp_path, offline=True) == other


def test_a_folder_or_a_file_in_one_is_used_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    assert resolve_tokenizer(str(tmp_path)) == tmp_path
    assert resolve_tokenizer(str(tmp_path / "tokenizer.json")) == tmp_path


@pytest.mark.parametrize(
    ("text", "files", "error", "message"),
    [
        (
            "acme/absent",
            None,
            ModelUnavailableError,
            r"^acme/absent is not in .* HF_HUB_OFFLINE is set: mount",
        ),
        (
            "acme/weights-only",
            {"model.safetensors": "x"},
            ModelUnavailableError,
            r"^acme/weights-only is not in",
        ),
        (
            "not an id",
            None,
            ConfigError,
            r"^--tokenizer 'not an id' is not a folder and not a Hugging Face id",
        ),
    ],
)
def test_a_tokenizer_that_does_not_resolve_says_what_to_do_in_one_line(
    tmp_path: Path, text: str, files: dict[str, str] | None, error: type[Exception], message: str
) -> None:
    if files is not None:
        add_model(tmp_path, text, files)
    with pytest.raises(error, match=message) as raised:
        resolve_tokenizer(text, cache_dir=tmp_path, offline=True)
    assert "\n" not in str(raised.value)


def test_chats_are_counted_with_the_tokenizers_template_not_the_models(
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
) -> None:
    template = PREAMBLE + model_template(model_dir)
    folder = add_model(tmp_path / "hub", "acme/tok", tokenizer_files(model_dir, template))
    files = CountingFiles(str(folder), str(model_dir), "acme/tok")
    told = request_facts("/v1/chat/completions", CHAT, files.counter(EngineChat()))
    own = request_facts("/v1/chat/completions", CHAT, load_counter(str(model_dir)))
    assert told.exact
    assert own.exact
    assert told.prompts[0] > own.prompts[0] + 10  # the preamble vLLM renders with --tokenizer


@pytest.mark.parametrize(
    ("config", "tokenizer_extra", "mode", "chats_exact"),
    [
        (LLAMA, {}, "hf", True),
        ({"architectures": ["DeepseekV32ForCausalLM"]}, {}, "deepseek_v32", False),  # the served model's
        (
            LLAMA,
            {"tekken.json": "{}", "consolidated.safetensors": "x"},
            "mistral",
            False,
        ),  # the tokenizer's files
    ],
)
def test_the_mode_comes_from_the_models_architecture_and_the_tokenizers_files(
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
    config: dict[str, Any],
    tokenizer_extra: dict[str, str],
    mode: str,
    chats_exact: bool,
) -> None:
    """vLLM picks DeepSeek-V3.2's mode from ``--model``'s config, the Mistral mode from ``--tokenizer``'s files."""
    model = served_model(model_dir, tmp_path / "model", config)
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    files_of = tokenizer_files(model_dir, model_template(model_dir)) | tokenizer_extra
    for name, value in files_of.items():
        (tokenizer / name).write_text(value if isinstance(value, str) else json.dumps(value))
    (tokenizer / "config.json").write_text(json.dumps(LLAMA))  # a tokenizer repository's own: not the model's
    files = CountingFiles(str(tokenizer), str(model), str(tokenizer))
    counter = files.counter(EngineChat())
    assert files.described(counter)["tokenizer_mode"] == mode
    assert request_facts("/v1/chat/completions", CHAT, counter).exact is chats_exact


def test_an_unresolved_tokenizer_counts_by_estimate_and_says_why(
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Never the model's own template while vLLM's is missing: that count would be called exact."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # as the chart runs the sidecar
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    files, later = separate_tokenizer("acme/absent", None, model_dir)
    assert files is not None
    assert later is not None
    assert files.problem is not None
    assert "acme/absent is not in" in files.problem
    counter = files.counter(EngineChat())
    assert not request_facts("/v1/chat/completions", CHAT, counter).exact
    late_model = files.with_model(model_dir).counter(EngineChat())  # --model resolving changes nothing here
    assert not request_facts("/v1/chat/completions", CHAT, late_model).exact
    described = files.described(counter)
    assert (described["counter"], described["tokenizer"]) == ("estimate", "acme/absent")
    assert described["tokenizer_unresolved"] == files.problem


def test_without_a_tokenizer_flag_the_model_folder_counts(model_dir: Path) -> None:  # noqa: F811
    assert separate_tokenizer(None, None, model_dir) == (None, None)
    files = CountingFiles(None).with_model(model_dir)
    assert files.tokenizer == str(model_dir)
    assert "tokenizer" not in files.described(files.counter(EngineChat()))


def test_late_resolution_reloads_the_counter(
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
) -> None:
    """vLLM fills the HF cache while the sidecar serves: the tokenizer resolves, then counts are exact."""
    files, later = separate_tokenizer(str(tmp_path / "not-yet"), None, model_dir)
    assert files is not None
    assert later is not None
    logs = io.StringIO()
    counting = PromptCounting(files, EngineChat(), CountAudit(), make_logger(logs))
    assert not request_facts("/v1/chat/completions", CHAT, counting.load()).exact
    template = PREAMBLE + model_template(model_dir)
    folder = add_model(tmp_path / "hub", "acme/tok", tokenizer_files(model_dir, template))
    counter = asyncio.run(counting.reload(tokenizer=folder))
    assert request_facts("/v1/chat/completions", CHAT, counter).exact
    assert counting.audit.counting["counter"] == "tokenizer"
    assert "tokenizer_unresolved" not in counting.audit.counting
    lines = [json.loads(line) for line in logs.getvalue().splitlines()]
    assert [line["counter"] for line in lines if line["event"] == "prompt_counts"] == [
        "estimate",
        "tokenizer",
    ]
