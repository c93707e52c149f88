"""The admission proxy on real sockets, in front of a fake vLLM whose KV usage the test steers."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sidecar.admission.controller import QueueSettings
from sidecar.admission.decide import AdmissionConfig, AdmissionMode
from sidecar.admission.pressure import PressureSettings
from sidecar.settings import ClientLimits
from tests.fake_vllm import FakeVllm
from tests.integration.conftest import STARTED, RunningSidecar, start_sidecar

pytestmark = pytest.mark.integration

SHORT = list(range(10))  # token ids: exact counts
LONG = list(range(600))  # >= 512 = half of the fake's max_model_len 1024
FAST_PRESSURE = PressureSettings(window=0.2)
SENT = [0]  # generation requests the current test sent through a sidecar


@pytest.fixture(autouse=True)
def every_request_is_accounted_for() -> Iterator[None]:
    """After every test: admitted + refused + dropped + cancelled == generation requests sent."""
    SENT[0] = 0
    STARTED.clear()
    yield
    counted = 0.0
    for app in STARTED:
        for family in app.registry.collect():
            if family.name == "kv_sidecar_admission":
                counted += sum(s.value for s in family.samples if s.name.endswith("_total"))
        assert app.controller.total_inflight == 0
    assert counted == SENT[0], f"sent {SENT[0]} generation requests, the sidecar accounted for {counted}"


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


@pytest.fixture(autouse=True)
def calm_engine(fake_vllm: FakeVllm) -> None:
    """Start every test with the engine's KV cache calm (the recorded page says 1.0)."""
    fake_vllm.state.set_kv_usage(0.1)


@pytest.fixture
async def proxied(fake_vllm: FakeVllm) -> AsyncIterator[RunningSidecar]:
    running = await start_sidecar(fake_vllm.url, proxy=True, pressure=FAST_PRESSURE)
    yield running
    await running.app.stop()


async def post(
    base: str,
    prompt: list[int] | str,
    *,
    path: str = "/v1/completions",
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> tuple[int, dict[str, str], Any]:
    SENT[0] += 1
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            base + path, json={"model": "tiny", "prompt": prompt, "max_tokens": 16, **extra}, headers=headers
        ) as response,
    ):
        body = await response.json(content_type=None)
        return response.status, dict(response.headers), body


async def status(sidecar: RunningSidecar) -> dict[str, Any]:
    return (await sidecar.get("/status")).json()  # type: ignore[no-any-return]


async def admission_counts(sidecar: RunningSidecar) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families((await sidecar.get("/metrics")).text):
        if family.name == "kv_sidecar_admission":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    outcome = sample.labels["outcome"]
                    totals[outcome] = totals.get(outcome, 0.0) + sample.value
    return totals


async def enter_pressure(fake: FakeVllm, sidecar: RunningSidecar) -> None:
    fake.state.set_kv_usage(0.95)

    async def pressured() -> bool:
        return bool((await status(sidecar))["admission"]["pressure"]["effective"] == "pressure")

    await eventually(pressured)


async def test_non_generation_routes_are_forwarded_unchanged(
    fake_vllm: FakeVllm, proxied: RunningSidecar
) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(proxied.proxy + "/v1/models") as response:
            assert response.status == 200
            assert (await response.json())["data"][0]["max_model_len"] == 1024
        async with session.put(
            proxied.proxy + "/echo/a/b?x=1&y=%20z",
            data=b"raw-bytes",
            headers={
                "Authorization": "Bearer sk-secret",
                "Connection": "keep-alive, X-Hop",
                "X-Hop": "1",
                "X-Keep": "2",
            },
        ) as response:
            assert response.status == 200
            assert await response.json() == {"method": "PUT", "path": "/echo/a/b", "bytes": 9}
        async with session.get(proxied.proxy + "/nowhere") as response:
            assert response.status == 404  # the upstream's answer, passed through
    headers = fake_vllm.state.last_headers
    assert fake_vllm.state.last_path == "/echo/a/b?x=1&y=%20z"
    assert headers["Authorization"] == "Bearer sk-secret"
    assert headers["X-Keep"] == "2"
    assert "X-Hop" not in headers
    assert headers["X-Forwarded-For"] == "127.0.0.1"
    assert "sk-secret" not in "".join(str(e) for e in proxied.logs())


async def test_streaming_chunks_arrive_as_they_are_sent(fake_vllm: FakeVllm, proxied: RunningSidecar) -> None:
    fake_vllm.state.stream_chunks, fake_vllm.state.chunk_delay = 4, 0.25
    arrivals: list[float] = []
    started = time.monotonic()
    SENT[0] += 1
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxied.proxy + "/v1/completions", json={"prompt": SHORT, "max_tokens": 4, "stream": True}
        ) as response,
    ):
        assert response.headers["Content-Type"].startswith("text/event-stream")
        payload = b""
        async for chunk in response.content.iter_any():
            arrivals.append(time.monotonic() - started)
            payload += chunk
    assert payload.count(b"data: ") == 5
    assert payload.endswith(b"data: [DONE]\n\n")
    assert arrivals[0] < 0.2  # the first chunk was not held back until the stream ended
    assert arrivals[-1] > 0.9


async def test_pressure_queues_long_prompts_and_releases_them(
    fake_vllm: FakeVllm, proxied: RunningSidecar
) -> None:
    await enter_pressure(fake_vllm, proxied)
    long_request = asyncio.create_task(post(proxied.proxy, LONG))

    async def queued() -> bool:
        return bool((await status(proxied))["admission"]["queue_depth"]["long"] == 1)

    await eventually(queued)
    short_status, short_headers, _ = await post(proxied.proxy, SHORT)  # short prompts keep flowing
    assert short_status == 200
    assert "X-KV-Sidecar-Reason" not in short_headers
    assert not long_request.done()
    assert fake_vllm.state.generation_requests == 1
    fake_vllm.state.set_kv_usage(0.3)
    code, _, body = await asyncio.wait_for(long_request, 5)
    assert code == 200
    assert body["choices"][0]["text"] == "ok"
    counts = await admission_counts(proxied)
    assert counts == {"admitted": 2.0}


async def test_reject_mode_answers_429_with_a_computed_retry_after(fake_vllm: FakeVllm) -> None:
    running = await start_sidecar(
        fake_vllm.url, proxy=True, pressure=FAST_PRESSURE, admission=AdmissionConfig(on_pressure="reject")
    )
    try:
        await enter_pressure(fake_vllm, running)
        code, headers, body = await post(running.proxy, LONG)
        assert code == 429
        assert headers["X-KV-Sidecar-Reason"] == "kv-pressure"
        assert 1 <= int(headers["Retry-After"]) <= 300
        assert body["error"]["code"] == "kv-pressure"
        assert body["error"]["type"] == "rate_limit_error"
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert (await post(running.proxy, SHORT))[0] == 200
        assert fake_vllm.state.generation_requests == 1
    finally:
        await running.app.stop()


async def test_long_lane_runs_one_at_a_time_under_the_lanes_policy(fake_vllm: FakeVllm) -> None:
    running = await start_sidecar(
        fake_vllm.url, proxy=True, pressure=FAST_PRESSURE, admission=AdmissionConfig(mode=AdmissionMode.LANES)
    )
    try:
        fake_vllm.state.response_delay = 0.3
        await eventually(lambda: _max_model_len_known(running))  # the lanes split at half of it
        results = await asyncio.gather(
            *(post(running.proxy, LONG) for _ in range(3)), post(running.proxy, SHORT)
        )
        assert [r[0] for r in results] == [200, 200, 200, 200]
        assert fake_vllm.state.peak_running == 2  # one long + the short one
    finally:
        await running.app.stop()


async def test_capacity_runs_as_many_long_requests_as_fit(
    fake_vllm: FakeVllm, proxied: RunningSidecar
) -> None:
    """The fake's pool is 16 blocks of 128 (15 usable); 600 + 16 tokens are 5 blocks each."""
    fake_vllm.state.response_delay = 0.3
    await eventually(lambda: _max_model_len_known(proxied))
    await eventually(lambda: _policy_is(proxied, "capacity"))
    prompts = [[i, *LONG[1:]] for i in range(4)]  # distinct from the first token: no prefix is shared
    results = await asyncio.gather(*(post(proxied.proxy, prompt) for prompt in prompts))
    assert [r[0] for r in results] == [200] * 4
    # 3 x 5 blocks fill the 15 (the gauge's 10% is theirs once they run); a fourth waits for a release
    assert fake_vllm.state.peak_running == 3


async def test_capacity_counts_a_shared_prefix_once(fake_vllm: FakeVllm, proxied: RunningSidecar) -> None:
    """The same 600 ids: 4 full blocks shared, 1 private each, so all four run beside the gauge's 2."""
    fake_vllm.state.response_delay = 0.3
    await eventually(lambda: _policy_is(proxied, "capacity"))
    results = await asyncio.gather(*(post(proxied.proxy, LONG) for _ in range(4)))
    assert [r[0] for r in results] == [200] * 4
    assert fake_vllm.state.peak_running == 4


async def test_what_vllm_refuses_is_400_without_reaching_the_engine(
    fake_vllm: FakeVllm, proxied: RunningSidecar
) -> None:
    await eventually(lambda: _max_model_len_known(proxied))
    code, headers, body = await post(proxied.proxy, [1, 2], max_tokens=5000)  # vLLM always refuses this
    assert (code, headers["X-KV-Sidecar-Reason"], body["error"]["param"]) == (
        400,
        "context-length-exceeded",
        "max_tokens",
    )
    assert "max_tokens=5000" in body["error"]["message"]
    code, _, body = await post(proxied.proxy, list(range(1024)), max_tokens=1)  # no room left for output
    assert code == 400
    assert fake_vllm.state.generation_requests == 0
    assert (await post(proxied.proxy, list(range(1000)), max_tokens=100))[
        0
    ] == 200  # vLLM serves it, shortened
    assert fake_vllm.state.generation_requests == 1


async def _policy_is(sidecar: RunningSidecar, policy: str) -> bool:
    return bool((await sidecar.get("/status")).json()["admission"]["policy"]["effective"] == policy)


async def _max_model_len_known(sidecar: RunningSidecar) -> bool:
    return bool((await sidecar.get("/budget")).json()["engine"]["max_model_len"] == 1024)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"prompt": 5}', "'prompt' must be"),
        (b'{"prompt": "x", "max_tokens": "many"}', "'max_tokens' must be"),
        (b"\xff\xfe", "not valid UTF-8"),
        (b"[" * 100_000, "nests JSON too deeply"),
    ],
)
async def test_bad_bodies_get_400_naming_the_problem(
    fake_vllm: FakeVllm, proxied: RunningSidecar, data: bytes, message: str
) -> None:
    SENT[0] += 1
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxied.proxy + "/v1/completions", data=data, headers={"Content-Type": "application/json"}
        ) as response,
    ):
        body = await response.json()
        assert response.status == 400
        assert response.headers["X-KV-Sidecar-Reason"] == "invalid-request"
    assert message in body["error"]["message"]
    assert fake_vllm.state.generation_requests == 0


async def test_body_limit(fake_vllm: FakeVllm) -> None:
    running = await start_sidecar(fake_vllm.url, proxy=True, limits=ClientLimits(max_body_bytes=1000))
    try:
        code, headers, _ = await post(running.proxy, "x" * 2000)
        assert (code, headers["X-KV-Sidecar-Reason"]) == (413, "body-too-large")

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the limit applies while reading
            for _ in range(10):
                yield b" " * 200

        async with (
            aiohttp.ClientSession() as session,
            session.post(running.proxy + "/echo/x", data=chunked()) as r,
        ):
            assert r.status == 413
        # the whole chunked body in the head's packet: read without waiting, and still held to the limit
        host, port = running.proxy.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /echo/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"7d0\r\n"
            + b" " * 2000
            + b"\r\n0\r\n\r\n"
        )
        await writer.drain()
        status_line = await reader.readline()
        writer.close()
        assert status_line.split()[1] == b"413"
        assert fake_vllm.state.generation_requests == 0
    finally:
        await running.app.stop()


async def test_engine_down_is_503_with_retry_after() -> None:
    fake = FakeVllm()
    await fake.start()
    url = fake.url
    await fake.stop()
    running = await start_sidecar(url, proxy=True)
    try:
        code, headers, body = await post(running.proxy, SHORT)
        assert code == 503
        assert headers["X-KV-Sidecar-Reason"] == "engine-unavailable"
        assert 1 <= int(headers["Retry-After"]) <= 300
        assert body["error"]["code"] == "engine-unavailable"
        assert (await admission_counts(running)).get("refused") == 1.0
    finally:
        await running.app.stop()


async def test_queue_timeout_from_a_header_and_queue_full(fake_vllm: FakeVllm) -> None:
    running = await start_sidecar(
        fake_vllm.url, proxy=True, pressure=FAST_PRESSURE, queue=QueueSettings(max_entries=1, timeout=30)
    )
    try:
        await enter_pressure(fake_vllm, running)
        waiting = asyncio.create_task(post(running.proxy, LONG))
        await eventually(lambda: _depth(running, 1))
        code, headers, _ = await post(running.proxy, LONG)
        assert (code, headers["X-KV-Sidecar-Reason"]) == (429, "queue-full")
        assert int(headers["Retry-After"]) >= 1
        waiting.cancel()
        await eventually(lambda: _depth(running, 0))
        started = time.monotonic()
        code, headers, _ = await post(running.proxy, LONG, headers={"X-KV-Sidecar-Queue-Timeout": "300ms"})
        assert (code, headers["X-KV-Sidecar-Reason"]) == (503, "queue-timeout")
        assert 0.25 < time.monotonic() - started < 2
        assert int(headers["Retry-After"]) >= 1
        counts = await admission_counts(running)
        assert counts == {"admitted": 0.0, "refused": 1.0, "dropped": 1.0, "cancelled": 1.0}
    finally:
        await running.app.stop()


async def _depth(sidecar: RunningSidecar, depth: int) -> bool:
    return bool((await status(sidecar))["admission"]["queue_depth"]["long"] == depth)


async def test_client_leaving_the_queue_is_seen_at_once(fake_vllm: FakeVllm, proxied: RunningSidecar) -> None:
    await enter_pressure(fake_vllm, proxied)
    waiting = [asyncio.create_task(post(proxied.proxy, LONG)) for _ in range(20)]
    await eventually(lambda: _depth(proxied, 20))
    for task in waiting:
        task.cancel()
    await eventually(lambda: _depth(proxied, 0), within=2)
    assert fake_vllm.state.generation_requests == 0
    assert (await admission_counts(proxied)).get("cancelled") == 20.0
    assert await cancelled_in_lane(proxied) == {"long": 20.0}  # the lane they waited in, not "short"


async def cancelled_in_lane(sidecar: RunningSidecar) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    lanes: dict[str, float] = {}
    for family in text_string_to_metric_families((await sidecar.get("/metrics")).text):
        if family.name == "kv_sidecar_admission":
            for sample in family.samples:
                if (
                    sample.name.endswith("_total")
                    and sample.labels["outcome"] == "cancelled"
                    and sample.value
                ):
                    lanes[sample.labels["lane"]] = lanes.get(sample.labels["lane"], 0.0) + sample.value
    return lanes


async def test_client_leaving_mid_stream_aborts_the_upstream(
    fake_vllm: FakeVllm, proxied: RunningSidecar
) -> None:
    fake_vllm.state.stream_chunks, fake_vllm.state.chunk_delay = 50, 0.1
    async with aiohttp.ClientSession() as session:
        SENT[0] += 1
        response = await session.post(
            proxied.proxy + "/v1/completions", json={"prompt": SHORT, "stream": True}
        )
        await response.content.readany()
        assert fake_vllm.state.running == 1
        response.close()  # the client goes away mid-stream

    async def upstream_aborted() -> bool:
        return fake_vllm.state.aborted == 1 and fake_vllm.state.running == 0

    await eventually(upstream_aborted, within=3)
    assert (await status(proxied))["admission"]["inflight"] == {"short": 0, "long": 0}


async def test_drain_finishes_streams_and_refuses_the_rest(fake_vllm: FakeVllm) -> None:
    running = await start_sidecar(fake_vllm.url, proxy=True, pressure=FAST_PRESSURE, drain_timeout=5.0)
    fake_vllm.state.stream_chunks, fake_vllm.state.chunk_delay = 6, 0.1
    try:
        async with aiohttp.ClientSession() as session:
            SENT[0] += 1
            stream = await session.post(
                running.proxy + "/v1/completions", json={"prompt": SHORT, "stream": True}
            )
            await stream.content.readany()
            await enter_pressure(fake_vllm, running)
            queued = asyncio.create_task(post(running.proxy, LONG))
            await eventually(lambda: _depth(running, 1))
            drained = asyncio.create_task(running.app.drain())
            code, headers, _ = await asyncio.wait_for(queued, 3)
            assert (code, headers["X-KV-Sidecar-Reason"]) == (503, "draining")
            assert (await running.get("/readyz")).status_code == 503
            code, headers, _ = await post(running.proxy, SHORT)
            assert (code, headers["X-KV-Sidecar-Reason"]) == (503, "draining")
            assert int(headers["Retry-After"]) >= 1
            rest = await stream.content.read()  # the in-flight stream still ends normally
            assert rest.endswith(b"data: [DONE]\n\n")
            stream.close()
            assert await asyncio.wait_for(drained, 5) is True
        counts = await admission_counts(running)
        assert counts == {"admitted": 1.0, "refused": 1.0, "dropped": 1.0}
    finally:
        await running.app.stop()


async def test_every_request_is_accounted_for(fake_vllm: FakeVllm, proxied: RunningSidecar) -> None:
    fake_vllm.state.response_delay = 0.05
    await enter_pressure(fake_vllm, proxied)
    sent = [post(proxied.proxy, LONG if i % 3 == 0 else SHORT) for i in range(30)]
    sent.append(post(proxied.proxy, list(range(2000))))  # never fits
    tasks = [asyncio.create_task(s) for s in sent]
    await asyncio.sleep(0.3)
    fake_vllm.state.set_kv_usage(0.1)
    results = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    codes = sorted(r[0] for r in results)
    assert codes.count(200) == 30
    assert codes.count(400) == 1
    counts = await admission_counts(proxied)
    assert sum(counts.values()) == len(sent)
    assert counts["admitted"] == 30


@pytest.fixture
def qwen_tokenizer_model(tmp_path: Path) -> Path:
    """The tiny model's config.json beside the real Qwen3 tokenizer.json (fetched by scripts/fetch-tokenizer)."""
    import json  # noqa: PLC0415

    from tests.fake_vllm import TINY_CONFIG  # noqa: PLC0415

    root = Path(__file__).parents[2]
    fetched = subprocess.run(
        [str(root / "scripts/fetch-tokenizer")], capture_output=True, text=True, check=True
    )
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_CONFIG))
    (model / "tokenizer.json").write_bytes(Path(fetched.stdout.strip()).read_bytes())
    return model


async def test_exact_counts_with_the_models_tokenizer(
    fake_vllm: FakeVllm, qwen_tokenizer_model: Path
) -> None:
    """With --model pointing at a directory holding tokenizer.json, text prompts are counted exactly
    (in a worker thread from 4 KiB on) and a text prompt that can never fit gets 400 before vLLM."""
    running = await start_sidecar(fake_vllm.url, proxy=True, tokenizer_model=str(qwen_tokenizer_model))
    try:
        assert running.app.proxy is not None
        assert running.app.proxy.counter.exact
        await eventually(lambda: _max_model_len_known(running))
        text = ENGLISH  # 313 tokens by the Qwen tokenizer
        assert (await post(running.proxy, text))[0] == 200  # 313 + 16 fit 1,024
        code, headers, body = await post(running.proxy, text * 4)  # 1,252 >= 1,024; 6 KB: counted off-loop
        assert (code, headers["X-KV-Sidecar-Reason"]) == (400, "context-length-exceeded")
        assert "has 1252" in body["error"]["message"]
        assert fake_vllm.state.generation_requests == 1
    finally:
        await running.app.stop()


ENGLISH = (Path(__file__).parents[1] / "data" / "text" / "english.txt").read_text()
