"""A fast stand-in for vLLM, for benchmarks: fixed completions, SSE streams that carry their send time.

Run: ``python -m bench.fast_upstream PORT``. ``/metrics`` serves a recorded real vLLM page (KV usage
0.1), ``/v1/models`` says ``max_model_len`` 32768, ``POST /v1/completions`` answers a small fixed
JSON at once, or (``"stream": true``) sends ``chunks`` SSE events whose first carries
``time.monotonic()`` at the moment of sending (the clock is system-wide on Linux, so the client can
subtract it).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from aiohttp import web

PAGE = (Path(__file__).parent.parent / "tests/data/vllm/vllm-0.32.0-cpu-tiny-kv-pressure.prom").read_text()
PAGE = re.sub(r"^(vllm:kv_cache_usage_perc\{[^\n]*\}) \S+$", r"\1 0.1", PAGE, flags=re.MULTILINE)
ANSWER = json.dumps(
    {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]}
).encode()


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.Response(body=ANSWER, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunks = int(body.get("chunks", 1))
    await response.write(f'data: {{"sent": {time.monotonic()!r}}}\n\n'.encode())
    for _ in range(chunks - 1):
        await response.write(b'data: {"choices": [{"text": "t"}]}\n\n')
    await response.write(b"data: [DONE]\n\n")
    return response


async def metrics(_: web.Request) -> web.Response:
    return web.Response(text=PAGE, content_type="text/plain")


async def models(_: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "bench", "max_model_len": 32768}]})


def main() -> None:
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)


if __name__ == "__main__":
    main()
