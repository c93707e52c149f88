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

**Chat prompts** are counted exactly the way vLLM builds them: the template vLLM would choose for the chat
(:mod:`sidecar.admission.chat_template`: the server's ``--chat-template``, else a multimodal processor's
for chats without tools, else the tokenizer's, a named ``tool_use`` one for chats with tools) rendered with
``jinja2`` as transformers renders it, with the messages, tools and variables vLLM builds
(:mod:`sidecar.admission.conversation`), then tokenized without adding special tokens (vLLM's chat default,
``add_special_tokens=False``). A template that fails to render, or a request vLLM would refuse, falls back to
the estimate. Counts are exact only where vLLM's tokenizer mode uses ``tokenizer.json`` and the template
(:mod:`sidecar.admission.tokenizer_mode`); elsewhere they are near.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Protocol

from sidecar.admission.chat_template import ChatTemplates
from sidecar.admission.conversation import EngineChat
from sidecar.admission.tokenizer_mode import HF_TOKENIZING, EngineTokenizing
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


class TokenizerCounter:
    """Counts with a Hugging Face ``tokenizer.json`` (and the model's chat template when it has one).

    Exact where vLLM tokenizes and renders with the same (``tokenizing``: its tokenizer mode); near otherwise.
    """

    def __init__(
        self, path: Path, template: ChatTemplates | None = None, tokenizing: EngineTokenizing = HF_TOKENIZING
    ) -> None:
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
        self.tokenizing = tokenizing
        self.exact = tokenizing.texts_exact  # another tokenizer in vLLM (mistral_common's Tekken, ...): near
        self.chats_exact = tokenizing.chats_exact  # not for gpt-oss (Harmony) or vLLM's own encoders

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


def load_counter(
    model: str | None, chat: EngineChat | None = None, *, config: Path | None = None
) -> TokenCounter:
    """The tokenizer's counter when ``model`` is a folder with ``tokenizer.json`` (and tokenizers installed).

    ``chat``: how vLLM was told to render chats (its template, content format, tools for ``"none"``, its
    tokenizer mode); the counter is exact where vLLM's tokenizer mode uses that tokenizer and template.
    ``config``: the folder of the served model's ``config.json``, whose architecture can choose vLLM's
    tokenizer mode, when ``model`` is another folder (vLLM's ``--tokenizer``); else ``model``'s own.
    """
    if model:
        path = Path(model).expanduser()
        directory = path if path.is_dir() else path.parent
        candidate = directory / "tokenizer.json"
        if path.exists() and candidate.is_file():
            try:
                architecture = json.loads(((config or directory) / "config.json").read_text())
            except (OSError, ValueError):
                architecture = {}
            told = (chat or EngineChat()).tokenizer_mode
            files = [entry.name for entry in directory.iterdir()]
            tokenizing = EngineTokenizing.of(
                told, architecture if isinstance(architecture, dict) else {}, files
            )
            try:
                return TokenizerCounter(candidate, ChatTemplates.load(directory, chat), tokenizing)
            except ConfigError:
                return EstimatingCounter()
    return EstimatingCounter()


def counts_described(counter: TokenCounter) -> dict[str, Any]:
    """How prompts are counted, for a log line: tokenizer or estimate, what is exact, vLLM's mode."""
    tokenizing = counter.tokenizing if isinstance(counter, TokenizerCounter) else None
    return {
        "counter": "estimate" if tokenizing is None else "tokenizer",
        "texts_exact": counter.exact,
        "chats_exact": counter.chats_exact,
        "tokenizer_mode": None if tokenizing is None else tokenizing.mode,
    }
