"""A completion of ``prompt_embeds`` on the real engine: served through the sidecar, and planned at its size.

vLLM 0.32.0 takes a completion whose prompt is a tensor of embeddings (``--enable-prompt-embeds``; no ``prompt``
needed: ``validate_prompt_and_prompt_embeds`` in ``entrypoints/openai/completion/protocol.py``), one prompt of
as many tokens as the tensor has rows. The sidecar answered such a request 400 "'prompt' is required": it
refused what vLLM serves.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sidecar.admission.body import request_facts
from tests.e2e.conftest import serve
from tests.e2e.spikes import start_beside
from tests.harness.spike import wait_idle
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e
ROWS = 300
EMBED = """
import base64, io, sys, torch
buffer = io.BytesIO()
torch.save(torch.randn(int(sys.argv[1]), 128, dtype=torch.bfloat16), buffer)
print(base64.b64encode(buffer.getvalue()).decode())
"""


@pytest.fixture(scope="module")
def embeds_server(
    vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """The tiny model's server, taking prompt embeddings."""
    yield from serve(vllm_env, tiny_model, tmp_path_factory, "vllm-embeds.log", ("--enable-prompt-embeds",))


def embeddings(python: Path, rows: int) -> str:
    """A ``rows`` x 128 bf16 tensor, saved by torch and base64-encoded, as vLLM's clients send it."""
    result = subprocess.run([str(python), "-c", EMBED, str(rows)], capture_output=True, text=True, check=True)
    return result.stdout.strip()


async def completion(url: str, body: dict[str, object]) -> int:
    """POST a completion; its ``usage.prompt_tokens``."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body) as response,
    ):
        answer = await response.json()
        assert response.status == 200, answer
    return int(answer["usage"]["prompt_tokens"])


async def test_prompt_embeds_pass_through_the_sidecar_and_are_learned(
    vllm_env: Path, embeds_server: VllmServer, tiny_model: Path
) -> None:
    body = {"model": "tiny", "prompt_embeds": embeddings(vllm_env, ROWS), "max_tokens": 4}
    await wait_idle(embeds_server.url)
    assert await completion(embeds_server.url, body) == ROWS
    app = await start_beside(embeds_server.url, tiny_model)
    assert app.proxy is not None
    facts = request_facts("/v1/completions", body, app.proxy.counter)
    try:
        assert app.controller.planner.media.planned(facts, 1024) == (1024,)  # its size unknown yet
        assert await completion(f"http://127.0.0.1:{app.proxy_port}", body) == ROWS
        assert ROWS <= app.controller.planner.media.planned(facts, 1024)[0] < 1024
    finally:
        await app.drain()
        await app.stop()
