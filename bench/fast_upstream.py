"""A fast stand-in for vLLM, for benchmarks: fixed completions, SSE streams that carry their send time.

Run: ``python -m bench.fast_upstream PORT [KV_USAGE | cycle:SECONDS]``. ``/metrics`` serves a recorded
real vLLM page with ``vllm:kv_cache_usage_perc`` set to KV_USAGE (default 0.1) and nothing running or
waiting in a 1M-token pool (an idle engine: the proxy-overhead benchmark measures the proxy, not
admission holding requests back), or the recorded page alternating between 0.3 and 0.95 every SECONDS
(pressure cycles for the soak, with the page's own running/waiting and 16-block pool), ``/v1/models`` says ``max_model_len`` 32768, ``POST /v1/completions`` answers a small fixed
JSON at once, or (``"stream": true``) sends ``chunks`` SSE events whose first carries
``time.monotonic()`` at the moment of sending (the clock is system-wide on Linux, so the client can
subtract it).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

from aiohttp import web

PAGE = (Path(__file__).parent.parent / "tests/data/vllm/vllm-0.32.0-cpu-tiny-kv-pressure.prom").read_text()
ANSWER = json.dumps(
    {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]}
).encode()


async def completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if delay := body.get("delay"):  # the soak's "long" requests take a while, like real generation
        await asyncio.sleep(float(delay))
    if not body.get("stream"):
        return web.Response(body=ANSWER, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunks = int(body.get("chunks", 1))
    try:
        await response.write(f'data: {{"sent": {time.monotonic()!r}}}\n\n'.encode())
        for _ in range(chunks - 1):
            await response.write(b'data: {"choices": [{"text": "t"}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
    except ConnectionResetError:  # the client (or the proxy on its behalf) went away: an engine aborts too
        pass
    return response


def page(kv_usage: float) -> str:
    """The recorded page with the KV usage substituted."""
    return re.sub(
        r"^(vllm:kv_cache_usage_perc\{[^\n]*\}) \S+$", rf"\g<1> {kv_usage}", PAGE, flags=re.MULTILINE
    )


async def models(_: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "bench", "max_model_len": 32768}]})


def idle(text: str) -> str:
    """The page with no request running or waiting and a pool of 8,192 blocks of 128 tokens."""
    text = re.sub(
        r"^(vllm:num_requests_(?:running|waiting)\{[^\n]*\}) \S+$", r"\g<1> 0.0", text, flags=re.MULTILINE
    )
    return text.replace('num_gpu_blocks="16"', 'num_gpu_blocks="8192"').replace(
        'num_gpu_blocks_override="16"', 'num_gpu_blocks_override="8192"'
    )


def main() -> None:
    setting = sys.argv[2] if len(sys.argv) > 2 else "0.1"
    cycle = float(setting.removeprefix("cycle:")) if setting.startswith("cycle:") else None
    fixed = idle(page(float(setting))) if cycle is None else ""
    calm, pressed = page(0.3), page(0.95)

    async def metrics(_: web.Request) -> web.Response:
        if cycle is None:
            return web.Response(text=fixed, content_type="text/plain")
        under_pressure = int(time.monotonic() / cycle) % 2 == 1  # pressure cycles: calm, pressed, calm, ...
        return web.Response(text=pressed if under_pressure else calm, content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)


if __name__ == "__main__":
    main()
