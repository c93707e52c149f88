"""vLLM's tokenizer mode: whether a model's chats are its Jinja template's, its text tokenizer.json's. Pure.

The sidecar counts exactly with the model's ``tokenizer.json`` and Jinja chat template. vLLM does so in its
``hf`` tokenizer mode only; other modes tokenize or render with code of their own, and a count from the
template is then a near count, never exact (no 400 on it, no shared prefix blocks, see
:mod:`sidecar.admission.body`). Read in vLLM 0.32.0 and 0.34.0:

* **The mode** (``ModelConfig.tokenizer_mode``, ``--tokenizer-mode``, default ``auto``). ``auto`` becomes a
  mode of the architecture's (``ModelConfig.__post_init__``, ``config/model.py``: :data:`ARCHITECTURE_MODES`),
  else ``mistral`` for a Mistral checkpoint, one with ``consolidated*.safetensors`` and ``tekken.json`` or
  ``tokenizer.model.v*`` (``resolve_tokenizer_args``, ``tokenizers/registry.py``: ``is_mistral_model_repo``
  and ``any_pattern_in_repo_files``), else ``hf``.
* **Its chats** (``renderers/registry.py``): the ``HfRenderer`` renders the Jinja template for ``hf``,
  ``kimi_audio``, ``alpamayo2_super`` and ``glm5_next``; the others render with Python encoders
  (``deepseek_v32``, ``deepseek_v4``, ``deepseek_v41``, ``kimi_k3``, ``inkling``, ``unlimited_ocr2``),
  mistral_common (``mistral``) or cohere_melody (``cohere``). Under ``hf``, a gpt-oss model (``model_type``
  ``gpt_oss``) is rendered with openai_harmony (``use_harmony``, ``renderers/online_renderer.py``).
* **Its text** (``tokenizers/registry.py``): ``mistral``, ``kimi_audio`` and ``alpamayo2_super`` load
  tokenizers of their own (mistral_common's Tekken, tiktoken); the others load the HF tokenizer (the
  DeepSeek ones override only its chat template).

A mode the sidecar does not know (vLLM takes plugins' modes) is taken as rendering and tokenizing with code
of its own. Where the files that decide a Mistral checkpoint are not in the directory the sidecar reads (a
Hub id it downloaded itself: weights are never fetched), tell it ``--tokenizer-mode`` as vLLM is told.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MODES_WITH_JINJA_CHATS = frozenset({"hf", "kimi_audio", "alpamayo2_super", "glm5_next"})
"""Modes whose chats vLLM renders with the model's Jinja template (``HfRenderer``)."""
MODES_WITH_HF_TEXT = frozenset(
    {"hf", "cohere", "deepseek_v32", "deepseek_v4", "deepseek_v41", "glm5_next", "kimi_k3", "inkling"}
)
"""Modes whose text vLLM tokenizes with the model's HF tokenizer."""
ARCHITECTURE_MODES: Mapping[str, str] = {
    "MoonshotKimiaForCausalLM": "kimi_audio",
    "KimiK3ForConditionalGeneration": "kimi_k3",
    "KimiK31ForConditionalGeneration": "kimi_k3",  # 0.34.0
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "DeepseekV4ForConditionalGeneration": "deepseek_v4",
    "DeepseekV41ForCausalLM": "deepseek_v41",
    "InklingForCausalLM": "inkling",
    "InklingForConditionalGeneration": "inkling",
    "Alpamayo2Super": "alpamayo2_super",  # 0.33.0
}
"""``auto`` as vLLM resolves it for these architectures."""
MISTRAL_TOKENIZER_FILES = ("tekken.json", "tokenizer.model.v*")
MISTRAL_WEIGHT_FILES = ("consolidated*.safetensors",)


def _any_match(names: Iterable[str], patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for name in names for pattern in patterns)


def resolved_mode(told: str, config: Mapping[str, Any], files: Iterable[str]) -> str:
    """The mode vLLM runs ``config``'s model in when told ``told``; ``files``: the checkpoint's file names."""
    if told != "auto":
        return told
    architectures = config.get("architectures")
    for architecture in architectures if isinstance(architectures, list) else []:
        if isinstance(architecture, str) and architecture in ARCHITECTURE_MODES:
            return ARCHITECTURE_MODES[architecture]
    names = list(files)
    if _any_match(names, MISTRAL_WEIGHT_FILES) and _any_match(names, MISTRAL_TOKENIZER_FILES):
        return "mistral"
    return "hf"


@dataclass(frozen=True, slots=True)
class EngineTokenizing:
    """How vLLM tokenizes a model's prompts: the resolved mode, and what the sidecar's counts are then."""

    mode: str
    harmony: bool = False
    """A gpt-oss model: chats rendered with openai_harmony."""

    @property
    def texts_exact(self) -> bool:
        """Whether ``tokenizer.json`` counts text as vLLM does."""
        return self.mode in MODES_WITH_HF_TEXT

    @property
    def chats_exact(self) -> bool:
        """Whether the Jinja template, then ``tokenizer.json``, count chats as vLLM does."""
        return self.texts_exact and self.mode in MODES_WITH_JINJA_CHATS and not self.harmony

    @classmethod
    def of(cls, told: str, config: Mapping[str, Any], files: Iterable[str]) -> EngineTokenizing:
        """The tokenizing of ``config``'s model under ``--tokenizer-mode`` ``told``."""
        return cls(resolved_mode(told, config, files), harmony=config.get("model_type") == "gpt_oss")


HF_TOKENIZING = EngineTokenizing("hf")
"""vLLM's ``hf`` mode: the model's tokenizer and Jinja template, as the sidecar counts."""
