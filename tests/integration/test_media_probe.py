"""Asking vLLM's ``/tokenize`` what a chat with media takes: the count, or nothing on any failure.

A local aiohttp server stands in for vLLM's ``/tokenize`` here (its real answers are checked in
``tests/e2e/test_media_engine.py`` on a tiny Qwen2-VL).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from sidecar.server import media_probe
from sidecar.server.media_probe import count_prompt

SEEN: list[tuple[bytes, str | None]] = []


async def tokenize(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    SEEN.append((body, request.headers.get("Authorization")))
    kind = request.query.get("kind") or body.decode()
    if kind == "count":
        return web.json_response({"count": 53, "max_model_len": 1024, "tokens": []})
    if kind == "slow":
        await asyncio.sleep(1.0)
        return web.json_response({"count": 1})
    if kind == "text":
        return web.Response(text="not json")
    if kind == "zero":
        return web.json_response({"count": 0})
    return web.json_response({"error": "no"}, status=400)


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    runner = web.AppRunner(app)
    await runner.setup()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


@pytest.mark.parametrize(
    ("kind", "count"), [("count", 53), ("slow", None), ("text", None), ("zero", None), ("bad", None)]
)
async def test_the_count_or_nothing(
    engine: str, kind: str, count: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(media_probe, "PROBE_TIMEOUT_SECONDS", 0.2)
    SEEN.clear()
    async with aiohttp.ClientSession() as session:
        assert await count_prompt(session, engine, kind.encode(), "Bearer k") == count
    assert [(kind.encode(), "Bearer k")] == SEEN  # the request's own bytes, its credentials


async def test_nothing_when_the_engine_is_gone() -> None:
    async with aiohttp.ClientSession() as session:
        assert await count_prompt(session, "http://127.0.0.1:9", b"{}", None) is None
