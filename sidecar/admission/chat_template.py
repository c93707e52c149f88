"""The chat template vLLM renders a chat with: chosen, compiled and rendered as vLLM and transformers do.

**Which template** (vLLM 0.32.0 ``resolve_chat_template``, ``vllm/renderers/hf.py``, the same in 0.34.0;
transformers 5.19, which vLLM 0.32.0's environment here has: ``from_pretrained`` and ``get_chat_template`` in
``tokenization_utils_base.py``):

1. the server's ``--chat-template`` (:class:`~sidecar.admission.conversation.EngineChat`), for every chat;
2. for a chat without tools, a multimodal processor's own template: transformers' ``ProcessorMixin`` reads a
   legacy ``chat_template.json`` before ``chat_template.jinja`` (:func:`processor_template`; without the
   legacy file it reads the tokenizer's files, the same templates as 3);
3. the tokenizer's: ``chat_template.jinja`` as ``default`` and each ``additional_chat_templates/NAME.jinja``
   as ``NAME`` when any of these files exists (they take priority over the config), else
   ``tokenizer_config.json``'s ``chat_template``, a text or a list of ``{"name", "template"}`` (Command-R's
   and Hermes-2-Pro's ``default``, ``tool_use``, ``rag``). With several, a chat whose tools reach the
   template (an empty list, or tools among its variables: :func:`rendered_tools`) gets ``tool_use`` where
   there is one, any other chat ``default``; without a ``default`` vLLM has no template and answers 400
   (the sidecar estimates, and vLLM answers).

Not modelled: vLLM's fallback templates for a few model types that have none
(``transformers_utils/chat_templates``: BLIP-2, PaliGemma, SigLIP, ...). Without one, chats are estimated;
an exact count that differs from vLLM's is corrected by the answers' usage
(:mod:`sidecar.admission.count_audit`) and vLLM's own recount before any refusal
(:mod:`sidecar.admission.recount`).

**How it is rendered**: in the sandboxed environment transformers' ``apply_chat_template`` sets up
(``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``tojson``, ``raise_exception``, ``strftime_now``, the
special tokens as variables), with the messages, tools and variables vLLM builds
(:mod:`sidecar.admission.conversation`, developer messages included); a template that loops over a message's
``content`` gets a list of ``{"type": "text", "text": ...}`` parts, any other the text parts joined by
newlines (``_detect_content_format``), unless vLLM was told the format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.admission.conversation import (
    CONTINUE_TAG,
    EngineChat,
    developer_as_system,
    rendered_tools,
    tagged,
    template_message,
    with_defaults,
)

TEMPLATE_FILE = "chat_template.jinja"
"""The tokenizer's template file, its ``default`` (transformers' ``CHAT_TEMPLATE_FILE``)."""
NAMED_TEMPLATES_DIR = "additional_chat_templates"
"""Where the tokenizer's other templates are, one ``NAME.jinja`` each (``CHAT_TEMPLATE_DIR``)."""
TOOLS_TEMPLATE = "tool_use"
"""The named template transformers picks for a chat with tools (``get_chat_template``)."""
LEGACY_PROCESSOR_TEMPLATE = "chat_template.json"
"""A multimodal processor's template file of old (transformers' ``LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE``)."""
PROCESSOR_CONFIGS = ("processor_config.json", "preprocessor_config.json")
"""Files a multimodal processor is loaded from."""


def _special_token(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(content := value.get("content"), str):
        return content
    return None


def _content_format(ast: Any) -> str:
    """``openai`` when the template loops over a message's ``content`` (or ``content``), else ``string``."""
    from jinja2 import nodes  # noqa: PLC0415 - optional dependency

    for loop in ast.find_all(nodes.For):
        target = loop.iter
        while isinstance(target, nodes.Filter | nodes.Test) and target.node is not None:
            target = target.node
        if (
            isinstance(target, nodes.Getitem)
            and isinstance(target.arg, nodes.Const)
            and target.arg.value == "content"
        ):
            return "openai"
        if isinstance(target, nodes.Getattr) and target.attr == "content":
            return "openai"
        if isinstance(target, nodes.Name) and target.name == "content":
            return "openai"
    return "string"


class ChatTemplate:
    """One chat template, compiled once, rendered as transformers renders it."""

    SPECIAL_TOKENS = (
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
    )

    def __init__(self, source: str, config: dict[str, Any], chat: EngineChat | None = None) -> None:
        import jinja2.ext  # noqa: PLC0415 - optional dependency (the tokens extra)
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(
            value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Sequence[str] | None = None, sort_keys: bool = False,
        ) -> str:  # fmt: skip
            seps = (separators[0], separators[1]) if separators is not None else None
            return json.dumps(
                value, ensure_ascii=ensure_ascii, indent=indent, separators=seps, sort_keys=sort_keys
            )

        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        environment.filters["tojson"] = tojson
        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = lambda fmt: datetime.now(UTC).strftime(fmt)
        self._template = environment.from_string(source)
        self.source = source
        chat = chat or EngineChat()
        detected = _content_format(environment.parse(source))
        self.content_format = detected if chat.content_format == "auto" else chat.content_format
        self._chat = chat
        self._specials = {
            name: token
            for name in self.SPECIAL_TOKENS
            if (token := _special_token(config.get(name))) is not None
        }

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        add_generation_prompt: bool,
        extra: dict[str, Any] | None,
    ) -> str:
        """The prompt text vLLM would tokenize, from the messages and variables as vLLM builds them.

        ``tools``: those the template gets (:func:`~sidecar.admission.conversation.rendered_tools`). With
        ``continue_final_message`` (in ``extra``) the final message is left open, as transformers 5.19
        leaves it (``render_jinja_template``, ``utils/chat_template_utils.py``): a tag appended to its text
        marks where the rendered chat is cut, so the template's closing tokens after it are not counted.
        """
        variables = {**with_defaults(self._chat.default_template_kwargs, extra or {}), **self._specials}
        variables.pop("tools", None)
        shaped = developer_as_system(
            [template_message(m, self.content_format) for m in messages], self.source
        )
        continued = bool(variables.get("continue_final_message")) and bool(shaped)
        if continued:
            shaped[-1] = tagged(shaped[-1])
        text: str = self._template.render(
            messages=shaped, tools=tools, add_generation_prompt=add_generation_prompt, **variables
        )
        if not continued:
            return text
        if CONTINUE_TAG.strip() not in text:
            raise ValueError("the template drops the final message: vLLM refuses to continue it")
        cut = text.rindex(CONTINUE_TAG.strip())
        return text[:cut] if text[cut : cut + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:cut].rstrip()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def tokenizer_templates(directory: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
    """The tokenizer's template (a text) or named templates, as transformers 5.19 loads them.

    Files first: ``chat_template.jinja`` (``default``) and ``additional_chat_templates/*.jinja``; a lone
    default is a text. Else ``tokenizer_config.json``'s ``chat_template`` (``config``): a text, or a list of
    ``{"name", "template"}`` (entries of another shape are passed over).
    """
    files: dict[str, str] = {}
    if (directory / TEMPLATE_FILE).is_file() and (text := _read(directory / TEMPLATE_FILE)) is not None:
        files["default"] = text
    if (named := directory / NAMED_TEMPLATES_DIR).is_dir():
        for path in sorted(named.glob("*.jinja")):
            if (text := _read(path)) is not None:
                files[path.name.removesuffix(".jinja")] = text
    if files:
        return files["default"] if list(files) == ["default"] else files
    source = config.get("chat_template")
    if isinstance(source, list):
        return {
            entry["name"]: entry["template"]
            for entry in source
            if isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("template"), str)
        }
    return source if isinstance(source, str) else None


def processor_template(directory: Path) -> str | None:
    """A multimodal processor's legacy ``chat_template.json``, which vLLM prefers for chats without tools.

    transformers 5.19's ``ProcessorMixin`` reads it before ``chat_template.jinja`` (``processing_utils.py``)
    and fails to load beside ``additional_chat_templates/``; vLLM then falls back to the tokenizer's
    (``_try_get_processor_chat_template``). A folder without a processor's config has no processor.
    """
    legacy = directory / LEGACY_PROCESSOR_TEMPLATE
    if not legacy.is_file() or not any((directory / name).is_file() for name in PROCESSOR_CONFIGS):
        return None
    if any((directory / NAMED_TEMPLATES_DIR).glob("*.jinja")):
        return None
    try:
        source = json.loads(legacy.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    return source if isinstance(source, str) else None


def _compiled(source: str | None, config: dict[str, Any], chat: EngineChat) -> ChatTemplate | None:
    if source is None:
        return None
    try:
        return ChatTemplate(source, config, chat)
    except ImportError:
        return None
    except Exception:  # noqa: BLE001 - jinja2 raises many kinds on a template it cannot compile
        return None


class ChatTemplates:
    """The templates vLLM may render a model's chats with, and the choice among them per chat."""

    def __init__(
        self,
        chat: EngineChat,
        tokenizer: ChatTemplate | Mapping[str, ChatTemplate] | None,
        *,
        processor: ChatTemplate | None = None,
        told: ChatTemplate | None = None,
    ) -> None:
        self._chat = chat
        self.told = told
        """``--chat-template``'s, for every chat."""
        self.processor = processor
        """A multimodal processor's, for chats without tools."""
        self.tokenizer = tokenizer if isinstance(tokenizer, ChatTemplate | None) else dict(tokenizer)
        """The tokenizer's: one, or several by name (``default``, ``tool_use``, ...)."""

    def chosen(self, tools: Any) -> ChatTemplate | None:
        """The template vLLM renders a chat with, given the ``tools`` it hands it; ``None`` where none."""
        if self.told is not None:
            return self.told
        reach = tools is not None
        if not reach and self.processor is not None:
            return self.processor
        if isinstance(self.tokenizer, ChatTemplate) or self.tokenizer is None:
            return self.tokenizer
        if reach and TOOLS_TEMPLATE in self.tokenizer:
            return self.tokenizer[TOOLS_TEMPLATE]
        return self.tokenizer.get("default")

    def render(
        self, messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool,
        extra: dict[str, Any] | None, tool_choice: Any = None,
    ) -> str:  # fmt: skip
        """The chosen template's :meth:`ChatTemplate.render`; ``ValueError`` where vLLM has no template.

        ``tools`` and ``tool_choice``: the request's; ``extra``: its template variables
        (:func:`~sidecar.admission.conversation.template_kwargs`).
        """
        given = rendered_tools(tools, tool_choice, extra or {}, self._chat)
        template = self.chosen(given)
        if template is None:
            raise ValueError("no default chat template: vLLM refuses the chat")
        return template.render(messages, given, add_generation_prompt, extra)

    @classmethod
    def load(cls, directory: Path, chat: EngineChat | None = None) -> ChatTemplates | None:
        """The templates vLLM renders with: ``--chat-template``'s, else the processor's and tokenizer's."""
        chat = chat or EngineChat()
        config_path = directory / "tokenizer_config.json"
        try:
            config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        except (OSError, ValueError):
            config = {}
        config = config if isinstance(config, dict) else {}
        if chat.template is not None:
            told = _compiled(chat.template, config, chat)
            return None if told is None else cls(chat, None, told=told)
        sources = tokenizer_templates(directory, config)
        tokenizer: ChatTemplate | dict[str, ChatTemplate] | None
        if isinstance(sources, str) or sources is None:
            tokenizer = _compiled(sources, config, chat)
        else:
            tokenizer = {
                name: t for name, text in sources.items() if (t := _compiled(text, config, chat))
            } or None
        processor = _compiled(processor_template(directory), config, chat)
        return None if tokenizer is None and processor is None else cls(chat, tokenizer, processor=processor)
