"""An in-process fake vLLM on a real socket, serving the recorded real pages with values substituted.

Tests steer it through :class:`FakeVllmState`: which page to serve (a real fixture, with sample
values replaced by :func:`substitute`), an HTTP status, a delay, or garbage. Pages stay real
around the substituted values, as the fixtures' README asks.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

DATA = Path(__file__).parent / "data" / "vllm"
PRESSURE_PAGE = "vllm-0.32.0-cpu-tiny-kv-pressure.prom"
AFTER_LOAD_PAGE = "vllm-0.32.0-cpu-tiny-after-load.prom"
GPU_PAGE = "vllm-0.10.x-gpu-qwen3-4b-fp8.prom"
V0_PAGE = "vllm-0.7-v0-engine-partial.prom"


TINY_CONFIG = {  # the 2-layer Qwen2 model the real-vLLM fixtures were recorded with (512 bytes of KV per token)
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 256,
    "vocab_size": 512,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}


def page(name: str) -> str:
    """A recorded real page."""
    return (DATA / name).read_text(encoding="utf-8")


def substitute(text: str, metric: str, value: float | str, *, label: str | None = None) -> str:
    """Replace the value of every sample of ``metric`` (with ``label``: only samples whose labels hold it)."""
    pattern = re.compile(rf"^({re.escape(metric)}(?:\{{[^\n]*\}})?) (\S+)$", re.MULTILINE)

    def replace(match: re.Match[str]) -> str:
        if label is not None and label not in match.group(1):
            return match.group(0)
        return f"{match.group(1)} {value}"

    result, count = pattern.subn(replace, text)
    if count == 0:
        raise AssertionError(f"{metric} is not on the page")
    return result


def substitute_label(text: str, metric: str, key: str, value: str) -> str:
    """Replace the value of label ``key`` on every sample of ``metric``."""
    pattern = re.compile(rf'^({re.escape(metric)}\{{[^\n]*?\b{key}=")[^"]*(")', re.MULTILINE)
    result, count = pattern.subn(rf"\g<1>{value}\g<2>", text)
    if count == 0:
        raise AssertionError(f"{metric} has no label {key}")
    return result


@dataclass
class FakeVllmState:
    """What the fake serves; tests change it while the server runs."""

    metrics_page: str = field(default_factory=lambda: page(PRESSURE_PAGE))
    metrics_status: int = 200
    metrics_delay: float = 0.0
    max_model_len: int = 1024
    model: str = "tiny"
    metrics_requests: int = 0
    json_metrics: bool = False  # as trtllm-serve: JSON at /metrics, Prometheus at /prometheus/metrics
    generation_status: int = 200
    die_after_chunks: int | None = None  # close the connection mid-stream (the engine died)
    drop_before_answer: bool = False  # close the connection before answering
    response_delay: float = 0.0
    stream_chunks: int = 3
    chunk_delay: float = 0.0
    generation_requests: int = 0
    running: int = 0
    peak_running: int = 0
    completed: int = 0
    aborted: int = 0
    last_headers: dict[str, str] = field(default_factory=dict)
    last_body: dict[str, object] = field(default_factory=dict)
    last_path: str = ""
    tokenize_count: int | None = (
        None  # what POST /tokenize answers as ``count``; None: 404, as an engine without it
    )
    tokenize_bodies: list[dict[str, object]] = field(default_factory=list)

    def set_kv_usage(self, value: float) -> None:
        """Serve the current page with ``vllm:kv_cache_usage_perc`` = ``value``."""
        self.metrics_page = substitute(self.metrics_page, "vllm:kv_cache_usage_perc", value)


def build_fake_vllm(state: FakeVllmState) -> web.Application:  # noqa: PLR0915 - one handler per route
    """The aiohttp app of the fake."""

    async def metrics(request: web.Request) -> web.Response:
        state.metrics_requests += 1
        if state.metrics_delay:
            await asyncio.sleep(state.metrics_delay)
        if state.json_metrics and request.path == "/metrics":
            return web.json_response([])  # trtllm-serve's iteration-stats queue, drained
        return web.Response(text=state.metrics_page, status=state.metrics_status, content_type="text/plain")

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": state.model, "object": "model", "max_model_len": state.max_model_len}],
            }
        )

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.generation_requests += 1
        state.last_headers = dict(request.headers)
        state.last_body = body
        state.last_path = str(request.rel_url)
        state.running += 1
        state.peak_running = max(state.peak_running, state.running)
        try:
            if state.drop_before_answer and request.transport is not None:
                request.transport.close()
                return web.Response(status=200)
            if state.generation_status != 200:
                return web.json_response(
                    {
                        "error": {
                            "message": "upstream says no",
                            "type": "BadRequestError",
                            "param": None,
                            "code": 400,
                        }
                    },
                    status=state.generation_status,
                )
            if body.get("stream"):
                response = web.StreamResponse(
                    headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                await response.prepare(request)
                for index in range(state.stream_chunks):
                    if state.die_after_chunks is not None and index == state.die_after_chunks:
                        assert request.transport is not None
                        request.transport.close()
                        return response
                    chunk = {
                        "id": "cmpl-1",
                        "object": "text_completion",
                        "choices": [{"index": 0, "text": f"t{index}"}],
                    }
                    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    await asyncio.sleep(state.chunk_delay)
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                state.completed += 1
                return response
            await asyncio.sleep(state.response_delay)
            state.completed += 1
            return web.json_response(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "model": state.model,
                    "choices": [{"index": 0, "text": "ok"}],
                }
            )
        except (asyncio.CancelledError, ConnectionResetError):
            state.aborted += 1
            raise
        finally:
            state.running -= 1

    async def echo(request: web.Request) -> web.Response:
        state.last_headers = dict(request.headers)
        state.last_path = str(request.rel_url)
        data = await request.read()
        return web.json_response(
            {"method": request.method, "path": request.path, "bytes": len(data)}, status=200
        )

    async def tokenize(request: web.Request) -> web.Response:
        state.tokenize_bodies.append(await request.json())
        state.last_headers = dict(request.headers)
        if state.tokenize_count is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.json_response(
            {"count": state.tokenize_count, "max_model_len": state.max_model_len, "tokens": []}
        )

    async def version(_: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})  # what the recorded pages' server answers

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/prometheus/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/responses", generate)  # a chat-shaped answer: enough for the proxy
    app.router.add_post("/tokenize", tokenize)
    app.router.add_route("*", "/echo/{tail:.*}", echo)
    return app


class FakeVllm:
    """Start and stop the fake on 127.0.0.1 (a fixed port lets a test stop and restart it)."""

    def __init__(self, state: FakeVllmState | None = None, port: int = 0) -> None:
        self.state = state or FakeVllmState()
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """The base URL."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Bind and serve."""
        self._runner = web.AppRunner(build_fake_vllm(self.state), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        server = site._server  # noqa: SLF001 - aiohttp has no public getter for the bound port
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Close the socket (the engine is 'down' afterwards)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
