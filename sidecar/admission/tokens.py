"""Prompt size in tokens: exact with the model's ``tokenizer.json``, else a conservative estimate.

**Exact** (:class:`TokenizerCounter`): Hugging Face ``tokenizers`` (the optional ``tokens`` extra)
loads ``tokenizer.json`` from the model directory given to ``--model``; counting needs no torch.

**Estimate** (:class:`EstimatingCounter`): one token per CJK character (Han, kana, Hangul, full-width
forms), one per ASCII digit (Qwen and Llama 3 split numbers into single digits), plus one per 4 UTF-8
bytes of everything else. Measured against the real Qwen3 tokenizer (the BPE Qwen2.5 also uses) by
``bench/token_estimate.py`` on the samples in ``tests/data/text/`` and the project's own sources:
English prose +18%, Chinese prose +52%, Python source -15% to +5%, JSON log lines -19%, a vLLM
``/metrics`` page -5% (``tests/unit/test_tokens.py`` holds these bands). The estimate leans high for
natural language, the safe side for lane and pressure decisions; the never-fits check (HTTP 400)
only refuses on exact counts (a tokenizer, or prompts given as token ids).

**Chat prompts** are counted exactly the way vLLM builds them: the model's own ``chat_template``
(``tokenizer_config.json``, or ``chat_template.jinja`` beside it) rendered with ``jinja2`` in the
sandboxed environment transformers' ``apply_chat_template`` sets up (``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, ``tojson``, ``raise_exception``, ``strftime_now``, the special
tokens as variables), then tokenized without adding special tokens (vLLM's chat default,
``add_special_tokens=False``). The template gets the messages, tools and variables vLLM builds
(:mod:`sidecar.admission.conversation`); a template that loops over a message's ``content`` gets
a list of ``{"type": "text", "text": ...}`` parts, any other the text parts joined by newlines
(``vllm/renderers/hf.py``, ``_detect_content_format``). A template that fails to render, or a
request vLLM would refuse, falls back to the estimate.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from sidecar.admission.conversation import (
    CONTINUE_TAG,
    EngineChat,
    tagged,
    template_message,
    template_tools,
    with_defaults,
)
from sidecar.errors import ConfigError

BYTES_PER_TOKEN = 4
"""The estimator's bytes per token for non-CJK text."""

_CJK_RANGES = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x2E80, 0x2FDF),  # CJK radicals
    (0x3000, 0x303F),  # CJK symbols and punctuation
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x31FF),  # Bopomofo etc.
    (0x3400, 0x4DBF),  # CJK Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xAC00, 0xD7AF),  # Hangul syllables
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF00, 0xFFEF),  # full-width forms
    (0x20000, 0x2FA1F),  # CJK Extensions B-F
)


_CJK = re.compile("[" + "".join(f"{chr(low)}-{chr(high)}" for low, high in _CJK_RANGES) + "]")


class TokenCounter(Protocol):
    """Counts tokens; ``exact`` says whether it is the model's own tokenizer."""

    exact: bool
    chats_exact: bool  # whether a chat's rendering is vLLM's (not for gpt-oss, which vLLM renders in Harmony)

    def count(self, text: str) -> int:
        """Tokens in ``text``."""
        ...

    def tokens(self, text: str, *, special: bool = False) -> list[int] | None:
        """The token ids of ``text`` (``special``: with its BOS and such), ``None`` when only estimating."""
        ...

    def chat_tokens(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: Any = None,
        tool_choice: Any = None,
        add_generation_prompt: bool = True,
        extra: dict[str, Any] | None = None,
        special: bool = False,
    ) -> list[int] | None:
        """The token ids of a chat rendered through the model's template, or ``None`` when it cannot."""
        ...


class EstimatingCounter:
    """The conservative estimate described in the module docstring."""

    exact = chats_exact = False

    def count(self, text: str) -> int:
        """Estimated tokens in ``text``."""
        digits = sum(text.count(d) for d in "0123456789")
        if text.isascii():
            return digits + math.ceil((len(text) - digits) / BYTES_PER_TOKEN)
        cjk_chars = _CJK.findall(text)
        cjk = len(cjk_chars)
        cjk_bytes = len("".join(cjk_chars).encode("utf-8"))
        other_bytes = len(text.encode("utf-8")) - cjk_bytes - digits
        return cjk + digits + math.ceil(other_bytes / BYTES_PER_TOKEN)

    def tokens(self, text: str, *, special: bool = False) -> list[int] | None:
        """An estimate has no token ids."""
        return None

    def chat_tokens(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: Any = None,
        tool_choice: Any = None,
        add_generation_prompt: bool = True,
        extra: dict[str, Any] | None = None,
        special: bool = False,
    ) -> list[int] | None:
        """An estimate cannot render a template."""
        return None


def _special_token(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(content := value.get("content"), str):
        return content
    return None


MEDIA_PART_KEYS = frozenset(
    {"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds"}
    | {"video_url", "video_embeds", "prompt_embeds"}
)
"""Keys that make a content part multimodal whatever its ``type`` (vLLM 0.32.0, ``renderers/chat_utils.py``:
``MM_PARSER_MAP`` less the text types)."""
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"})
"""Content part types that carry no multimodal data (``_TEXT_CONTENT_PART_TYPES`` there)."""


def media_parts(content: Any) -> int:
    """Multimodal parts (images, audio, video, embeddings) of a message's content, told as vLLM tells them.

    vLLM 0.32.0's ``has_non_text_content`` (``renderers/chat_utils.py``): a dict part with a media key, or
    whose ``type`` is not one of the text types. Their tokens are not in the text: the model's processor
    expands each into placeholder tokens that hold KV blocks like any other prompt token.
    """
    if not isinstance(content, list):
        return 0
    return sum(
        1
        for part in content
        if isinstance(part, dict)
        and (
            not MEDIA_PART_KEYS.isdisjoint(part)
            or not isinstance(kind := part.get("type", "text"), str)
            or kind not in TEXT_PART_TYPES
        )
    )


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
    """A model's chat template, compiled once, rendered as transformers renders it."""

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
        self, messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool,
        extra: dict[str, Any] | None, tool_choice: Any = None,
    ) -> str:  # fmt: skip
        """The prompt text vLLM would tokenize, from the messages, tools and variables as vLLM builds them.

        With ``continue_final_message`` (in ``extra``) the final message is left open, as transformers 5.19
        leaves it (``render_jinja_template``, ``utils/chat_template_utils.py``): a tag appended to its text
        marks where the rendered chat is cut, so the template's closing tokens after it are not counted.
        """
        chat = self._chat
        variables = {**with_defaults(chat.default_template_kwargs, extra or {}), **self._specials}
        dumped = template_tools(
            tools, tool_choice, exclude_when_choice_none=chat.exclude_tools_when_tool_choice_none
        )
        shaped = [template_message(m, self.content_format) for m in messages]
        continued = bool(variables.get("continue_final_message")) and bool(shaped)
        if continued:
            shaped[-1] = tagged(shaped[-1])
        text: str = self._template.render(
            messages=shaped, tools=dumped, add_generation_prompt=add_generation_prompt, **variables
        )
        if not continued:
            return text
        if CONTINUE_TAG.strip() not in text:
            raise ValueError("the template drops the final message: vLLM refuses to continue it")
        cut = text.rindex(CONTINUE_TAG.strip())
        return text[:cut] if text[cut : cut + len(CONTINUE_TAG)] == CONTINUE_TAG else text[:cut].rstrip()

    @classmethod
    def load(cls, directory: Path, chat: EngineChat | None = None) -> ChatTemplate | None:
        """The template vLLM renders, if any: ``chat``'s (its ``--chat-template``), else the model's.

        The model's is ``chat_template.jinja`` in ``directory``, else ``tokenizer_config.json``'s.
        """
        chat = chat or EngineChat()
        config_path = directory / "tokenizer_config.json"
        try:
            config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        except (OSError, ValueError):
            config = {}
        source: Any = chat.template
        if source is None and (directory / "chat_template.jinja").is_file():
            source = (directory / "chat_template.jinja").read_text()
        elif source is None:
            source = config.get("chat_template")
            if isinstance(source, list):  # named templates: vLLM uses "default"
                named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
                source = named.get("default")
        if not isinstance(source, str):
            return None
        try:
            return cls(source, config, chat)
        except ImportError:
            return None
        except Exception:  # noqa: BLE001 - jinja2 raises many kinds on a template it cannot compile
            return None


class TokenizerCounter:
    """Exact counts with a Hugging Face ``tokenizer.json`` (and the model's chat template when it has one)."""

    exact = True

    def __init__(self, path: Path, template: ChatTemplate | None = None, *, harmony: bool = False) -> None:
        try:
            from tokenizers import Tokenizer  # noqa: PLC0415 - optional dependency
        except ImportError:
            raise ConfigError(
                "exact token counts need the 'tokenizers' package: pip install 'kv-sidecar[tokens]'"
            ) from None
        try:
            self._tokenizer: Any = Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - the Rust binding raises a bare Exception
            raise ConfigError(f"cannot load {path}: {exc}") from None
        self._template = template
        self.chats_exact = not harmony  # vLLM renders gpt-oss chats with openai_harmony, not this template

    def count(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens added)."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def tokens(self, text: str, *, special: bool = False) -> list[int] | None:
        """The token ids of ``text``; ``special``: with the tokenizer's post-processor (a BOS, say)."""
        return list(self._tokenizer.encode(text, add_special_tokens=special).ids)

    def chat_tokens(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: Any = None,
        tool_choice: Any = None,
        add_generation_prompt: bool = True,
        extra: dict[str, Any] | None = None,
        special: bool = False,
    ) -> list[int] | None:
        """The chat rendered through the model's template and tokenized; ``None`` without a template.

        Messages and tools are rebuilt as vLLM rebuilds them (:mod:`sidecar.admission.conversation`); one
        vLLM would refuse, or a template that raises, gives ``None`` (the caller estimates).
        """
        if self._template is None:
            return None
        try:
            text = self._template.render(messages, tools, add_generation_prompt, extra, tool_choice)
        except Exception:  # noqa: BLE001 - a template may raise anything on unusual messages
            return None
        return self.tokens(text, special=special)


def load_counter(model: str | None, chat: EngineChat | None = None) -> TokenCounter:
    """The exact counter when ``model`` is a directory with ``tokenizer.json`` and tokenizers is installed.

    ``chat``: how vLLM was told to render chats (its template, content format, tools for ``"none"``).
    """
    if model:
        path = Path(model).expanduser()
        directory = path if path.is_dir() else path.parent
        candidate = directory / "tokenizer.json"
        if path.exists() and candidate.is_file():
            try:
                config = json.loads((directory / "config.json").read_text())
            except (OSError, ValueError):
                config = {}
            harmony = isinstance(config, dict) and config.get("model_type") == "gpt_oss"  # as vLLM decides
            try:
                return TokenizerCounter(
                    candidate,
                    ChatTemplate.load(directory, chat),
                    harmony=harmony,
                )
            except ConfigError:
                return EstimatingCounter()
    return EstimatingCounter()
