"""The running sidecar asks vLLM's ``/tokenize`` to count a prompt it would refuse as too long, and obeys it.

A local fake stands in for vLLM here (the real server's counts: ``tests/e2e/test_engine_parity.py``). The
sidecar estimates text prompts without a tokenizer: 1,100 words are far over the fake's 1,024-token context.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.fake_vllm import FakeVllm
from tests.integration.conftest import RunningSidecar, start_sidecar
from tests.integration.test_proxy import (  # noqa: F401 - the autouse fixtures apply here too
    _max_model_len_known,
    calm_engine,
    eventually,
    every_request_is_accounted_for,
    post,
    status,
)
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture

LONG_TEXT = "hello " * 1100


async def _recounts(sidecar: RunningSidecar) -> dict[str, Any]:
    return (await status(sidecar))["admission"]["prompt_count_checks"]["recounts"]  # type: ignore[no-any-return]


async def test_a_prompt_vllm_counts_short_enough_is_served(fake_vllm: FakeVllm) -> None:
    fake_vllm.state.tokenize_count = 1000
    running = await start_sidecar(fake_vllm.url, proxy=True)
    try:
        await eventually(lambda: _max_model_len_known(running))
        code, _, _ = await post(running.proxy, LONG_TEXT, add_special_tokens=False)
        assert code == 200
        assert fake_vllm.state.generation_requests == 1
        assert fake_vllm.state.tokenize_bodies == [
            {"model": "tiny", "add_special_tokens": False, "prompt": LONG_TEXT}
        ]
        assert await _recounts(running) == {"refused": 0, "served": 1, "unanswered": 0}
        page = (await running.get("/metrics")).text
        assert 'kv_sidecar_prompt_recounts_total{result="served"} 1.0' in page
    finally:
        await running.app.stop()


async def test_a_prompt_vllm_counts_too_long_is_refused_without_reaching_the_engine(
    fake_vllm: FakeVllm,
) -> None:
    fake_vllm.state.tokenize_count = 1100
    running = await start_sidecar(fake_vllm.url, proxy=True)
    try:
        await eventually(lambda: _max_model_len_known(running))
        code, headers, body = await post(running.proxy, LONG_TEXT, headers={"Authorization": "Bearer k"})
        assert (code, headers["X-KV-Sidecar-Reason"]) == (400, "context-length-exceeded")
        assert "has 1100" in body["error"]["message"]  # vLLM's count; the estimate alone never refuses
        assert fake_vllm.state.generation_requests == 0
        assert fake_vllm.state.last_headers["Authorization"] == "Bearer k"  # the client's credentials
        assert await _recounts(running) == {"refused": 1, "served": 0, "unanswered": 0}
        code, _, _ = await post(running.proxy, "short")
        assert code == 200
        assert len(fake_vllm.state.tokenize_bodies) == 1  # a prompt that fits is not asked about
    finally:
        await running.app.stop()


async def test_without_an_answer_the_estimate_is_forwarded_as_before(fake_vllm: FakeVllm) -> None:
    running = await start_sidecar(fake_vllm.url, proxy=True)  # the fake's /tokenize answers 404
    try:
        await eventually(lambda: _max_model_len_known(running))
        code, _, _ = await post(running.proxy, LONG_TEXT)
        assert code == 200  # vLLM gives its own answer to what the sidecar only estimates
        assert fake_vllm.state.generation_requests == 1
        assert await _recounts(running) == {"refused": 0, "served": 0, "unanswered": 1}
    finally:
        await running.app.stop()


async def test_status_says_how_prompts_are_counted(
    fake_vllm: FakeVllm,
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``/status`` names the counter, what it counts exactly and vLLM's tokenizer mode (tokenizer_mode.py)."""
    folder = tmp_path / "deepseek-v3.2"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, folder / name)
    (folder / "config.json").write_text(json.dumps({"architectures": ["DeepseekV32ForCausalLM"]}))
    for model, counting in (
        (str(folder), {"counter": "tokenizer", "texts_exact": True, "chats_exact": False,
                       "tokenizer_mode": "deepseek_v32"}),
        (None, {"counter": "estimate", "texts_exact": False, "chats_exact": False, "tokenizer_mode": None}),
    ):  # fmt: skip
        running = await start_sidecar(fake_vllm.url, proxy=True, tokenizer_model=model)
        try:
            assert (await status(running))["admission"]["prompt_count_checks"]["counting"] == counting
        finally:
            await running.app.stop()


async def test_the_proxy_counts_the_effort_vllms_reasoning_effort_map_renders(
    fake_vllm: FakeVllm,
    model_dir: Path,  # noqa: F811
) -> None:
    """``--reasoning-effort-map`` reaches the proxy's counts: a chat whose effort the map rewrites is counted
    as vLLM renders it (short here), not as sent (over the context: asked of /tokenize, then refused)."""
    from sidecar.admission.conversation import EngineChat  # noqa: PLC0415

    template = (
        "{% if reasoning_effort == 'none' %}" + "hello " * 1100 + "{% endif %}{{ messages[0]['content'] }}"
    )
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "q"}], "max_tokens": 4}
    for mapping, answer, asked in (({"none": "low"}, 200, 0), ({}, 400, 1)):
        fake_vllm.state.tokenize_bodies.clear()
        running = await start_sidecar(
            fake_vllm.url, proxy=True, tokenizer_model=str(model_dir),
            chat=EngineChat(template=template, reasoning_effort_map=mapping),
        )  # fmt: skip
        try:
            await eventually(lambda running=running: _max_model_len_known(running))
            code, _, body = await post(
                running.proxy, "", path="/v1/chat/completions", reasoning_effort="none", **chat
            )
            assert code == answer, (mapping, body)  # unmapped: the fake answers /tokenize 404, so the exact
            assert len(fake_vllm.state.tokenize_bodies) == asked, mapping  # count of 5,501 refuses
        finally:
            await running.app.stop()


async def test_a_responses_prompt_is_recounted_as_the_chat_its_route_renders(
    fake_vllm: FakeVllm,
    model_dir: Path,  # noqa: F811
) -> None:
    """An exact Responses count over the context is asked of ``/tokenize`` as a chat; vLLM's count decides."""
    fake_vllm.state.tokenize_count = 1000
    running = await start_sidecar(fake_vllm.url, proxy=True, tokenizer_model=str(model_dir))
    try:
        await eventually(lambda: _max_model_len_known(running))
        body = {"input": LONG_TEXT, "instructions": "be brief", "max_output_tokens": 4}
        code, _, answer = await post(running.proxy, "", path="/v1/responses", **body)
        assert code == 200, answer
        asked = fake_vllm.state.tokenize_bodies
        assert [ask["messages"] for ask in asked] == [
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": LONG_TEXT}]
        ]
        assert asked[0]["add_special_tokens"] is True
        assert await _recounts(running) == {"refused": 0, "served": 1, "unanswered": 0}
    finally:
        await running.app.stop()
