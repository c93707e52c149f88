"""Bare aiohttp pass-through proxies (no admission, no metrics): the baselines the sidecar is held to.

Run: ``python -m bench.bare_proxy LISTEN_PORT UPSTREAM_URL [--buffered]``. Streaming (the default) copies
the answer chunk by chunk as it arrives; ``--buffered`` is the thinnest possible proxy for non-streaming
answers: ``await upstream.read()`` into one ``web.Response`` (one write), which cannot stream.
"""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "upgrade", "te", "trailer"}


def main() -> None:
    upstream = sys.argv[2].rstrip("/")
    buffered = "--buffered" in sys.argv[3:]
    session: aiohttp.ClientSession | None = None

    async def handle(request: web.Request) -> web.StreamResponse:
        assert session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with session.request(
            request.method, upstream + str(request.rel_url), headers=headers, data=body
        ) as up:
            if buffered:
                data = await up.read()
                out = {k: v for k, v in up.headers.items() if k.lower() not in HOP}
                return web.Response(status=up.status, body=data, headers=out)
            response = web.StreamResponse(status=up.status)
            response.headers.update({k: v for k, v in up.headers.items() if k.lower() not in HOP})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def on_startup(_: web.Application) -> None:
        nonlocal session
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

    async def on_cleanup(_: web.Application) -> None:
        if session is not None:
            await session.close()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)


if __name__ == "__main__":
    main()
