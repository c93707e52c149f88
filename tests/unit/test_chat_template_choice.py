"""Which template vLLM renders a chat with, and what it does to developer messages first.

Two rules the sidecar's exact chat counts missed (both checked on the real CPU server in
``tests/e2e/test_engine_parity.py`` and ``tests/e2e/test_named_templates.py``):

* a tokenizer with several named templates (Command-R's and Hermes-2-Pro's ``default``, ``tool_use``, ``rag``
  in ``tokenizer_config.json``, or ``chat_template.jinja`` beside ``additional_chat_templates/*.jinja``) renders
  a chat with tools through ``tool_use`` (transformers' ``get_chat_template``, which vLLM's
  ``resolve_chat_template`` calls); the sidecar always rendered ``default``;
* vLLM 0.26.0 and later turn developer messages into system ones, merged into one at the front, for a
  template that does not name the role (``safe_apply_chat_template``): on the real server five developer chats
  counted 1-10 tokens above vLLM's usage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.chat_template import ChatTemplates, tokenizer_templates
from sidecar.admission.conversation import EngineChat, developer_as_system, rendered_tools
from sidecar.admission.tokens import load_counter
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

PLAIN = "{{ messages | length }}"  # names no role
NAMING = "{% if m == 'developer' %}{% endif %}"  # names it, as Qwen3.6 and gpt-oss templates do

SYS = {"role": "system", "content": "s"}
USER = {"role": "user", "content": "u"}


@pytest.mark.parametrize(
    ("messages", "template", "expected"),
    [
        ([SYS, USER], PLAIN, [SYS, USER]),  # no developer message: as they are
        ([{"role": "developer", "content": "d"}, USER], NAMING, [{"role": "developer", "content": "d"}, USER]),
        ([{"role": "developer", "content": "d"}, USER], NAMING.replace("'", '"'), None),  # either quote
        ([{"role": "developer", "content": "d", "name": "x", "tools": []}, USER], PLAIN,
         [{"role": "system", "content": "d", "name": "x"}, USER]),  # first and only: renamed, not merged
        ([SYS, {"role": "developer", "content": "d"}, USER], PLAIN, [{"role": "system", "content": "s\n\nd"}, USER]),
        ([USER, {"role": "developer", "content": [{"type": "text", "text": "a"}, "b"]}, USER], PLAIN,
         [{"role": "system", "content": "a\nb"}, USER, USER]),  # late: moved to the front, parts joined
        ([{"role": "developer", "content": ""}, SYS, USER], PLAIN,
         [{"role": "system", "content": "s"}, USER]),  # empty texts dropped from the merge
        ([USER, {"role": "developer", "content": None}], PLAIN, [{"role": "system", "content": ""}, USER]),
    ],
)  # fmt: skip
def test_developer_messages_become_one_system_message_where_the_template_lacks_the_role(
    messages: list[dict[str, Any]], template: str, expected: list[dict[str, Any]] | None
) -> None:
    assert developer_as_system(messages, template) == (messages if expected is None else expected)


def _named(directory: Path, **files: str) -> Path:
    for name, text in files.items():
        path = directory / (
            "chat_template.jinja" if name == "default" else f"additional_chat_templates/{name}.jinja"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return directory


@pytest.mark.parametrize(
    ("files", "config", "expected"),
    [
        ({}, {"chat_template": "T"}, "T"),
        ({}, {}, None),
        ({}, {"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "U"},
                                {"name": 3}, "junk"]}, {"default": "D", "tool_use": "U"}),
        ({"default": "J"}, {"chat_template": "T"}, "J"),  # a lone file: a text, over the config's
        ({"default": "J", "tool_use": "U"}, {"chat_template": "T"}, {"default": "J", "tool_use": "U"}),
        ({"rag": "R"}, {"chat_template": "T"}, {"rag": "R"}),  # files win even without a default
    ],
)  # fmt: skip
def test_the_tokenizers_templates_are_loaded_as_transformers_loads_them(
    tmp_path: Path, files: dict[str, str], config: dict[str, Any], expected: object
) -> None:
    assert tokenizer_templates(_named(tmp_path, **files), config) == expected


TOOL = {"type": "function", "function": {"name": "w"}}


@pytest.mark.parametrize(
    ("tools", "tool_choice", "exclude", "chosen"),
    [
        (None, None, False, "D"),
        ([], None, False, "U"),  # an empty list reaches it (the chat route refuses one)
        ([TOOL], "auto", False, "U"),
        ([TOOL], "none", False, "U"),
        ([TOOL], "none", True, "D"),  # excluded for tool_choice "none": no tools, the default
    ],
)
def test_a_chat_with_tools_gets_the_tool_use_template(
    tmp_path: Path, tools: Any, tool_choice: Any, exclude: bool, chosen: str
) -> None:
    templates = ChatTemplates.load(
        _named(tmp_path, default="D", tool_use="U"), EngineChat(exclude_tools_when_tool_choice_none=exclude)
    )
    assert templates is not None
    assert templates.render([USER], tools, True, None, tool_choice) == chosen


def test_without_a_default_only_tool_chats_have_a_template(tmp_path: Path) -> None:
    templates = ChatTemplates.load(_named(tmp_path, tool_use="U", rag="R"))
    assert templates is not None
    assert templates.render([USER], [TOOL], True, None) == "U"
    with pytest.raises(ValueError, match="no default chat template"):
        templates.render([USER], None, True, None)  # vLLM answers 400; the sidecar estimates
    told = ChatTemplates.load(tmp_path, EngineChat(template="F"))  # --chat-template serves every chat
    assert told is not None
    assert (told.render([USER], None, True, None), told.render([USER], [TOOL], True, None)) == ("F", "F")


def test_counts_follow_the_chosen_template(tmp_path: Path, model_dir: Path) -> None:  # noqa: F811
    """Counted through :func:`load_counter`, as the proxy counts: tools choose, no default estimates."""
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    templates = [{"name": "default", "template": "{{ messages[0]['content'] }}"},
                 {"name": "tool_use", "template": "{{ tools | tojson }}{{ messages[0]['content'] }}"}]  # fmt: skip
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": templates}))
    counter = load_counter(str(tmp_path))
    plain = request_facts("/v1/chat/completions", {"messages": [USER]}, counter)
    tooled = request_facts("/v1/chat/completions", {"messages": [USER], "tools": [TOOL]}, counter)
    assert plain.exact
    assert tooled.exact
    assert tooled.prompts[0] > plain.prompts[0] + 10  # the tools' JSON is in the prompt
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": templates[1:]}))
    assert not request_facts("/v1/chat/completions", {"messages": [USER]}, load_counter(str(tmp_path))).exact


@pytest.mark.parametrize(
    ("files", "plain", "tooled"),
    [
        ({"chat_template.json": {"chat_template": "P"}, "preprocessor_config.json": {}}, "P", "T"),
        ({"chat_template.json": {"chat_template": "P"}, "processor_config.json": {}}, "P", "T"),
        ({"chat_template.json": {"chat_template": "P"}}, "T", "T"),  # no processor to read it
        ({"chat_template.json": {"chat_template": "P"}, "preprocessor_config.json": {}, "chat_template.jinja": "J"},
         "P", "J"),  # the legacy file before the new one for the processor; the tokenizer reads the new one
        ({"chat_template.json": {"chat_template": "P"}, "preprocessor_config.json": {}, "chat_template.jinja": "J",
          "additional_chat_templates/rag.jinja": "R"}, "J", "J"),  # transformers refuses the mix: the tokenizer's
        ({"chat_template.json": {"chat_template": 3}, "preprocessor_config.json": {}}, "T", "T"),
    ],
)  # fmt: skip
def test_a_processors_legacy_template_serves_chats_without_tools(
    tmp_path: Path, files: dict[str, Any], plain: str, tooled: str
) -> None:
    """vLLM tries the processor's template before the tokenizer's, for chats without tools only."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "T"}))
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    templates = ChatTemplates.load(tmp_path)
    assert templates is not None
    assert templates.render([USER], None, True, None) == plain
    assert templates.render([USER], [TOOL], True, None, "none") == tooled
    told = ChatTemplates.load(tmp_path, EngineChat(template="F"))
    assert told is not None
    assert told.render([USER], None, True, None) == "F"


@pytest.mark.parametrize(
    ("tools", "variables", "defaults", "rendered"),
    [
        (None, {}, {}, None),
        ([TOOL], {}, {}, [{"type": "function", "function": {"name": "w", "description": None, "parameters": None}}]),
        (None, {"tools": [{"raw": 1}]}, {}, [{"raw": 1}]),  # chat_template_kwargs' tools, as sent
        ([TOOL], {"tools": [{"raw": 1}]}, {}, [{"raw": 1}]),  # ... over the request's own
        ([TOOL], {"tools": None}, {}, [{"type": "function", "function": {"name": "w", "description": None,
                                                                         "parameters": None}}]),
        (None, {}, {"tools": [{"server": 1}]}, [{"server": 1}]),  # the server's default, under both
    ],
)  # fmt: skip
def test_the_tools_a_template_gets_merge_as_vllms(
    tools: Any, variables: dict[str, Any], defaults: dict[str, Any], rendered: Any
) -> None:
    assert rendered_tools(tools, None, variables, EngineChat(default_template_kwargs=defaults)) == rendered


def test_tools_given_as_template_variables_choose_tool_use(tmp_path: Path) -> None:
    templates = ChatTemplates.load(
        _named(tmp_path, default="D", tool_use="U{% for t in tools %}{{ t | tojson }}{% endfor %}")
    )
    assert templates is not None
    assert templates.render([USER], None, True, {"tools": [{"raw": 1}]}) == 'U{"raw": 1}'
