"""Images on the real engine: the tokens they take, and admission planning them at what they take.

A tiny Qwen2-VL (``scripts/make_tiny_model.py --vl``; torchvision from ``scripts/install-vllm-vision``) on vLLM
0.32.0's CPU build: an image of up to 112 x 112 pixels becomes ``(h / 14) x (w / 14) / 4`` placeholder tokens
plus two markers (``Qwen2VLMultiModalProcessor._get_prompt_updates``), counted in ``usage.prompt_tokens``. The
sidecar used to drop image parts and count the text alone as exact; a spike of chats with four images each,
planned at their text, let vLLM preempt.
"""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.tokens import media_parts
from tests.e2e.conftest import serve
from tests.e2e.spikes import admission_status, start_beside
from tests.e2e.test_real_vllm import engine_sample
from tests.harness.spike import wait_idle
from tests.harness.vllm import VllmServer, make_tiny_model, vision_path
from tests.unit.test_media import MEDIA_CONTENTS

pytestmark = pytest.mark.e2e
CHAT = "/v1/chat/completions"
QUESTION = "Describe these pictures."
IMAGE_TOKENS = {56: 4 + 2, 112: 16 + 2}  # placeholders plus the two markers, per side of a square image


@pytest.fixture(scope="module")
def vl_model(vllm_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as a Qwen2-VL: images of 56 x 56 to 112 x 112 pixels."""
    return make_tiny_model(vllm_env, tmp_path_factory.mktemp("vl") / "tiny-vl", vl=True)


@pytest.fixture(scope="module")
def vl_server(
    vllm_env: Path, vl_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """vLLM with 16 blocks of 128 tokens, max_model_len 1024, at most four images a prompt."""
    yield from serve(
        vllm_env, vl_model, tmp_path_factory, "vllm-vl.log", ("--limit-mm-per-prompt", '{"image": 4}'),
        env={"PYTHONPATH": str(vision_path())},
    )  # fmt: skip


def png(side: int, shade: int) -> str:
    """A ``side`` x ``side`` grey PNG as a data URL (``shade`` tells images apart for vLLM's prefix cache)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([shade % 256]) * side for _ in range(side))
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit greyscale
    data = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )
    import base64  # noqa: PLC0415

    return "data:image/png;base64," + base64.b64encode(data).decode()


def body(sides: list[int], shade: int, **extra: object) -> dict[str, Any]:
    images = [
        {"type": "image_url", "image_url": {"url": png(side, shade + i)}} for i, side in enumerate(sides)
    ]
    content = [*images, {"type": "text", "text": QUESTION}]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


async def chat(url: str, request: dict[str, Any]) -> int:
    """POST a chat; its ``usage.prompt_tokens``."""
    async with aiohttp.ClientSession() as session, session.post(url + CHAT, json=request) as response:
        answer = await response.json()
        assert response.status == 200, answer
    return int(answer["usage"]["prompt_tokens"])


VLLMS_CHECK = """
import json, sys
from vllm.renderers.chat_utils import has_non_text_content
contents = json.load(sys.stdin)
print(json.dumps([has_non_text_content([{"role": "user", "content": c}]) for c in contents]))
"""


def test_media_parts_are_what_vllms_own_check_calls_non_text(vllm_env: Path) -> None:
    contents = [content for content, _ in MEDIA_CONTENTS]
    result = subprocess.run(
        [str(vllm_env), "-c", VLLMS_CHECK], input=json.dumps(contents), capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [media_parts(c) > 0 for c in contents]


async def test_an_image_adds_its_placeholders_to_the_prompt(vl_server: VllmServer) -> None:
    text = await chat(vl_server.url, body([], 0))
    for sides in ([56], [112], [56, 112]):
        expected = text + sum(IMAGE_TOKENS[side] for side in sides)
        assert await chat(vl_server.url, body(sides, 10 * len(sides) + sides[0])) == expected, sides


async def test_through_the_sidecar_images_are_planned_at_what_answers_said_they_took(
    vl_server: VllmServer, vl_model: Path
) -> None:
    await wait_idle(vl_server.url)
    app = await start_beside(vl_server.url, vl_model, tokenizer_model=str(vl_model))
    assert app.proxy is not None
    facts = request_facts(CHAT, body([112, 112], 0), app.proxy.counter)
    try:
        assert facts.media_items == 2
        assert app.controller.planner.media.planned(facts, 1024) == (1024,)  # nothing learned yet
        used = await chat(f"http://127.0.0.1:{app.proxy_port}", body([112, 112], 40))
        (bound,) = (await admission_status(app))["media_token_bounds"]  # type: ignore[misc]
        assert bound["samples"] == 2  # vLLM's count before it was admitted, and its answer's usage
        assert used <= app.controller.planner.media.planned(facts, 1024)[0] < 1024
    finally:
        await app.drain()
        await app.stop()


async def test_a_spike_of_image_chats_does_not_preempt_through_the_sidecar(
    vl_server: VllmServer, vl_model: Path
) -> None:
    """Three chats of four 112 x 112 images: 72 image tokens each. Each answer runs to 896 tokens less the text,
    so its text and answer fill 7 blocks of 128 and its images take it to 8: two such in the 15 usable blocks
    preempt. Planned at their text (the code before), two were let in at once."""
    text = await chat(vl_server.url, body([], 0))
    spike = [body([112] * 4, 60 + 8 * i, max_tokens=896 - text, ignore_eos=True) for i in range(3)]

    async def run(url: str, shade: int) -> int:
        await wait_idle(vl_server.url)
        before = (await engine_sample(vl_server.url))["preemptions"] or 0
        requests = [
            {**r, "messages": body([112] * 4, shade + 8 * i)["messages"]} for i, r in enumerate(spike)
        ]
        used = await asyncio.gather(*(chat(url, r) for r in requests))
        assert all(u == text + 4 * IMAGE_TOKENS[112] for u in used)
        await wait_idle(vl_server.url)
        return int(((await engine_sample(vl_server.url))["preemptions"] or 0) - before)

    straight = await run(vl_server.url, 100)
    assert straight >= 1, "straight did not preempt: the test no longer tests anything"
    app = await start_beside(vl_server.url, vl_model, tokenizer_model=str(vl_model))
    try:
        through = await run(f"http://127.0.0.1:{app.proxy_port}", 150)
    finally:
        await app.drain()
        await app.stop()
    print(f"\npreemptions: straight {straight}, through the sidecar {through}")
    assert through == 0


async def test_a_streamed_chat_without_usage_is_counted_by_vllm_first(
    vl_server: VllmServer, vl_model: Path
) -> None:
    """A chat stream carries no usage unless asked: the sidecar asks ``/tokenize`` for the count before it admits
    the chat (until the key has 20 samples), so even stream-only clients' media get planned at their size."""
    await wait_idle(vl_server.url)
    used = await chat(vl_server.url, body([112, 56], 200))
    app = await start_beside(vl_server.url, vl_model, tokenizer_model=str(vl_model))
    assert app.proxy is not None
    facts = request_facts(CHAT, body([112, 56], 210), app.proxy.counter)
    try:
        streamed = body([112, 56], 210, stream=True)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{app.proxy_port}" + CHAT, json=streamed) as response,
        ):
            assert response.status == 200
            text = await response.text()
        assert '"usage"' not in text  # nothing for the answer to teach
        (bound,) = (await admission_status(app))["media_token_bounds"]  # type: ignore[misc]
        assert bound["samples"] == 1
        assert used <= app.controller.planner.media.planned(facts, 1024)[0] < 1024
    finally:
        await app.drain()
        await app.stop()
