"""The running sidecar counts a chat's tools as the vLLM it fronts renders them.

vLLM started with ``--exclude-tools-when-tool-choice-none`` renders no tools for ``tool_choice`` ``"none"``
(``renderers/online_renderer.py``, 0.32.0); the sidecar told the same flag counts such a chat without them,
and keeps counting them when not told (vLLM's default).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.conversation import EngineChat
from tests.fake_vllm import FakeVllm
from tests.integration.conftest import start_sidecar
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture
from tests.unit.test_conversation import TOOL_TEMPLATE

CHAT = {
    "messages": [{"role": "user", "content": "the KV cache"}],
    "tools": [{"type": "function", "function": {"name": "weather", "description": "the weather today"}}],
    "tool_choice": "none",
}


@pytest.fixture
def tool_model(tmp_path: Path, model_dir: Path) -> Path:  # noqa: F811
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": TOOL_TEMPLATE}))
    return tmp_path


@pytest.mark.parametrize("excluded", [True, False])
async def test_the_flag_reaches_the_proxys_counter(
    fake_vllm: FakeVllm, tool_model: Path, excluded: bool
) -> None:
    running = await start_sidecar(
        fake_vllm.url,
        proxy=True,
        tokenizer_model=str(tool_model),
        chat=EngineChat(exclude_tools_when_tool_choice_none=excluded),
    )
    try:
        assert running.app.proxy is not None
        counted = request_facts("/v1/chat/completions", CHAT, running.app.proxy.counter)
        bare = request_facts("/v1/chat/completions", {**CHAT, "tools": None}, running.app.proxy.counter)
        assert counted.exact
        assert (counted.prompts == bare.prompts) is excluded
    finally:
        await running.app.stop()
