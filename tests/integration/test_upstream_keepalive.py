"""Idle connections to the engine are dropped before the engine drops them: no 502 for the race.

vLLM's server closes a keep-alive connection after 5 s idle (uvicorn's ``timeout_keep_alive``, vLLM 0.32.0's
``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``). The proxy kept idle engine connections for 60 s, so a request could go out
on a connection the engine was closing: "Connection reset by peer", answered 502 ``engine-error`` (one of
the 640 generous-max-tokens requests of the admission suite of 2026-12-07 13:18, in round 14). Now the proxy keeps
them ``upstream_keepalive`` (4 s) at most. The stand-in engine here resets a connection that was idle longer
than its keep-alive when the next request comes, the worst case of that race, made certain. (A POST: aiohttp
retries an idempotent request that meets a closed connection, but not a generation request.)
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import aiohttp

from sidecar.settings import ClientLimits, ScrapeSettings
from tests.integration.conftest import start_sidecar

ENGINE_KEEPALIVE = 0.4


async def _head(reader: asyncio.StreamReader) -> bytes:
    """The next request's head, or nothing once the client has closed the connection."""
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return b""


async def _engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 keep-alive; a request on a connection idle longer than ENGINE_KEEPALIVE is reset."""
    last = time.monotonic()
    try:
        while head := await _head(reader):
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
            await reader.readexactly(length)
            if time.monotonic() - last > ENGINE_KEEPALIVE:
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()  # RST: what a client sees when the engine closed first
                return
            body = b'{"object": "list", "data": []}'
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(
                body
            )
            writer.write(head + body)
            await writer.drain()
            last = time.monotonic()
    finally:
        writer.close()


async def test_an_idle_engine_connection_is_not_reused_past_the_keepalive() -> None:
    server = await asyncio.start_server(_engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = ClientLimits(upstream_keepalive=ENGINE_KEEPALIVE / 2)
    running = await start_sidecar(f"http://127.0.0.1:{port}", proxy=True, limits=limits)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(running.proxy + "/tokenize", json={"prompt": "x"}) as response:
                    assert response.status == 200, await response.text()
                await asyncio.sleep(ENGINE_KEEPALIVE * 1.5)
    finally:
        await running.app.stop()
        server.close()
        await server.wait_closed()


async def test_the_scraper_does_not_reuse_an_engine_connection_past_the_keepalive() -> None:
    """The scraper's own client follows the same limit (httpx kept idle connections 5 s, vLLM's own figure)."""
    server = await asyncio.start_server(_engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limits = ClientLimits(upstream_keepalive=ENGINE_KEEPALIVE / 2)
    scrape = ScrapeSettings(
        interval=ENGINE_KEEPALIVE * 1.5, calm_interval=ENGINE_KEEPALIVE * 1.5, timeout=0.5
    )
    running = await start_sidecar(f"http://127.0.0.1:{port}", limits=limits, scrape=scrape)
    try:
        await asyncio.sleep(ENGINE_KEEPALIVE * 6)  # four or five scrapes, each after an idle spell
        assert await running.metric("kv_sidecar_scrape_errors_total", reason="connect") in (None, 0.0)
        scrapes = await running.metric("kv_sidecar_scrape_duration_seconds_count", page="full")
        assert (scrapes or 0) >= 3
    finally:
        await running.app.stop()
        server.close()
        await server.wait_closed()
