"""``kv-sidecar run --no-proxy`` and ``kv-sidecar check`` as real processes against the fake vLLM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fake_vllm import TINY_CONFIG, FakeVllm
from tests.harness.vllm import free_port
from tests.hf_cache import add_model

DRAFTERS = Path(__file__).parents[1] / "data" / "drafters"  # published drafter configs

pytestmark = pytest.mark.integration
KV_SIDECAR = [sys.executable, "-m", "sidecar"]


async def run_cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *KV_SIDECAR, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_check_names_the_fp8_diagnosis_and_fails(fake_vllm: FakeVllm, tiny_model_dir: Path) -> None:
    flags = [
        "--upstream",
        fake_vllm.url,
        "--model",
        str(tiny_model_dir),
        "--gpu-memory",
        "24GiB",
        "--nvml",
        "off",
    ]
    code, out, err = await run_cli("check", *flags, "--kv-cache-dtype", "fp8")
    assert code == 1, err
    assert "kv-dtype-not-in-effect" in out
    assert "2,048" in out  # the engine's pool, next to the prediction
    code, out, _ = await run_cli("check", *flags)
    assert code == 0, out
    assert "no problems found" in out


async def test_check_json(fake_vllm: FakeVllm, tiny_model_dir: Path) -> None:
    code, out, _ = await run_cli(
        "check", "--upstream", fake_vllm.url, "--model", str(tiny_model_dir), "--gpu-memory", "24GiB",
        "--kv-cache-dtype", "fp8", "--format", "json", "--nvml", "off",
    )  # fmt: skip
    report = json.loads(out)
    assert code == 1
    assert report["engine"]["kv_pool_tokens"] == 2048
    assert report["predicted"]["kv_pool_tokens"] == 2048
    assert [d["id"] for d in report["diagnoses"]] == ["kv-dtype-not-in-effect"]


async def test_check_with_the_engine_down() -> None:
    code, out, _ = await run_cli(
        "check", "--upstream", "http://127.0.0.1:9", "--scrape-timeout", "1s", "--nvml", "off"
    )
    assert code == 1
    assert "engine-down" in out


async def _wait_for_admin(url: str) -> None:
    deadline = time.monotonic() + 20
    async with httpx.AsyncClient() as client:
        while True:
            try:
                if (await client.get(url + "/healthz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("the sidecar did not start")
            await asyncio.sleep(0.1)


async def _metric(url: str, name: str) -> float | None:
    async with httpx.AsyncClient() as client:
        text = (await client.get(url + "/metrics")).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


async def test_run_no_proxy_end_to_end(fake_vllm: FakeVllm, tiny_model_dir: Path) -> None:
    admin = f"http://127.0.0.1:{free_port()}"
    proc = await asyncio.create_subprocess_exec(
        *KV_SIDECAR, "run", "--no-proxy", "--upstream", fake_vllm.url,
        "--admin-listen", admin.removeprefix("http://"), "--scrape-interval", "100ms",
        "--model", str(tiny_model_dir), "--gpu-memory", "24GiB", "--nvml", "off",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_for_admin(admin)
        await asyncio.sleep(0.3)
        assert await _metric(admin, "kv_sidecar_engine_kv_cache_usage_ratio") == 1.0
        async with httpx.AsyncClient() as client:
            budget = (await client.get(admin + "/budget")).json()
        assert budget["engine"]["kv_pool_tokens"] == 2048
        assert budget["predicted"]["kv_pool_tokens"] == 2048
        await fake_vllm.stop()
        await asyncio.sleep(1.0)
        assert await _metric(admin, "kv_sidecar_engine_up") == 0.0
        age = await _metric(admin, "kv_sidecar_engine_metrics_age_seconds")
        assert age is not None
        assert age > 0.5
    finally:
        events = await _stop(proc)
    assert events.count("engine_down") == 1
    assert events[-1] == "stopped"


async def test_run_rejects_a_busy_admin_port(fake_vllm: FakeVllm) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = await run_cli(
            "run",
            "--no-proxy",
            "--upstream",
            fake_vllm.url,
            "--admin-listen",
            f"127.0.0.1:{port}",
            "--nvml",
            "off",
        )
    assert code == 2
    assert err.startswith("kv-sidecar: error: cannot listen")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--no-proxy"], "--upstream"),
        (["run", "--no-proxy", "--upstream", "http://x", "--scrape-interval", "10ms"], "minimum is 50ms"),
        (["run", "--no-proxy", "--upstream", "http://x", "--admin-listen", "nowhere"], "invalid address"),
        (["check", "--upstream", "http://x", "--model", "nope"], "unknown model"),
    ],
)
async def test_bad_engine_flags(args: list[str], message: str) -> None:
    code, _, err = await run_cli(*args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


async def test_sigterm_drains_a_stream_then_exits_zero(fake_vllm: FakeVllm) -> None:
    fake_vllm.state.set_kv_usage(0.1)
    fake_vllm.state.stream_chunks, fake_vllm.state.chunk_delay = 10, 0.1
    admin, proxy = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        *KV_SIDECAR, "run", "--upstream", fake_vllm.url, "--listen", f"127.0.0.1:{proxy}",
        "--admin-listen", f"127.0.0.1:{admin}", "--scrape-interval", "100ms", "--nvml", "off", "--drain-timeout", "5s",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_for_admin(f"http://127.0.0.1:{admin}")
        import aiohttp  # noqa: PLC0415

        async with aiohttp.ClientSession() as session:
            stream = await session.post(
                f"http://127.0.0.1:{proxy}/v1/completions", json={"prompt": [1, 2, 3], "stream": True}
            )
            await stream.content.readany()
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            async with session.get(f"http://127.0.0.1:{admin}/readyz") as ready:
                assert ready.status == 503
            async with session.post(f"http://127.0.0.1:{proxy}/v1/completions", json={"prompt": [1]}) as late:
                assert late.status == 503
                assert late.headers["X-KV-Sidecar-Reason"] == "draining"
            rest = await stream.content.read()
            assert rest.endswith(b"data: [DONE]\n\n")
            stream.close()
        await asyncio.wait_for(proc.wait(), 10)
        assert time.monotonic() - started < 5
    finally:
        if proc.returncode is None:
            proc.kill()
        _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    events = [json.loads(line)["event"] for line in err.decode().splitlines()]
    assert events[-2:] == ["draining", "stopped"] or events[-1] == "stopped"


async def test_sigterm_under_load_loses_no_accepted_request(fake_vllm: FakeVllm) -> None:
    import aiohttp  # noqa: PLC0415

    fake_vllm.state.stream_chunks, fake_vllm.state.chunk_delay = 15, 0.1
    fake_vllm.state.set_kv_usage(0.95)
    admin, proxy = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        *KV_SIDECAR, "run", "--upstream", fake_vllm.url, "--listen", f"127.0.0.1:{proxy}",
        "--admin-listen", f"127.0.0.1:{admin}", "--scrape-interval", "100ms", "--nvml", "off",
        "--pressure-window", "300ms", "--drain-timeout", "5s", "--long-prompt-tokens", "100",
        "--admission", "lanes",  # short streams flow while long prompts queue behind pressure
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{proxy}"
    try:
        await _wait_for_admin(f"http://127.0.0.1:{admin}")
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 10
            while True:
                async with session.get(f"http://127.0.0.1:{admin}/status") as r:
                    if (await r.json())["admission"]["pressure"]["effective"] == "pressure":
                        break
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)

            async def stream() -> bytes:
                async with session.post(base + "/v1/completions", json={"prompt": [1], "stream": True}) as r:
                    assert r.status == 200
                    return await r.read()

            async def queued() -> tuple[int, str]:
                async with session.post(base + "/v1/completions", json={"prompt": list(range(200))}) as r:
                    return r.status, r.headers.get("X-KV-Sidecar-Reason", "")

            streams = [asyncio.create_task(stream()) for _ in range(8)]
            waiting = [asyncio.create_task(queued()) for _ in range(5)]
            await asyncio.sleep(0.4)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            bodies = await asyncio.wait_for(asyncio.gather(*streams), 10)
            refusals = await asyncio.wait_for(asyncio.gather(*waiting), 10)
        await asyncio.wait_for(proc.wait(), 10)
        assert time.monotonic() - started < 5.5
    finally:
        if proc.returncode is None:
            proc.kill()
        _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert all(b.endswith(b"data: [DONE]\n\n") for b in bodies)  # every accepted stream finished
    assert refusals == [(503, "draining")] * 5  # every queued request was answered, none lost


def _empty_hf_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "hub"
    cache.mkdir()
    return cache


async def _stop(proc: asyncio.subprocess.Process) -> list[str]:
    """SIGTERM ``run``; the events it logged, once it has exited 0."""
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=15)
    assert proc.returncode == 0
    return [json.loads(line)["event"] for line in err.decode().splitlines()]


async def _run_offline(
    fake_vllm: FakeVllm, cache: Path, *flags: str
) -> tuple[str, str, asyncio.subprocess.Process]:
    """``kv-sidecar run`` with ``flags``, offline over the HF cache at ``cache``; its ports and process."""
    admin, proxy = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent)}
    proc = await asyncio.create_subprocess_exec(
        *KV_SIDECAR, "run", "--upstream", fake_vllm.url, "--listen", proxy, "--admin-listen", admin,
        "--gpu-memory", "24GiB", "--nvml", "off", "--model-retry", "0.3s", *flags,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    return admin, proxy, proc


async def test_run_serves_while_its_model_is_unresolved_and_predicts_once_the_cache_has_it(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    """A Hub id outside the catalog, offline, not yet cached: traffic flows, /budget says why, then it resolves."""
    cache = _empty_hf_cache(tmp_path)
    admin, proxy, proc = await _run_offline(fake_vllm, cache, "--model", "acme/llama-next-8b")
    try:
        await _wait_for_admin("http://" + admin)
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.post(
                f"http://{proxy}/v1/completions", json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}
            )
            assert answer.status_code == 200
            budget = (await client.get(f"http://{admin}/budget")).json()
            assert budget["predicted"] is None
            assert budget["model"]["error"].startswith("acme/llama-next-8b is not in")
            assert "HF_HUB_OFFLINE" in budget["prediction_error"]
            assert "model-unresolved" in [d["id"] for d in budget["diagnoses"]]
            assert (
                await _metric_labelled(
                    f"http://{admin}", "kv_sidecar_diagnosis_active", 'id="model-unresolved"'
                )
                == 1
            )
            add_model(cache, "acme/llama-next-8b", {"config.json": TINY_CONFIG})  # vLLM finished downloading
            deadline = time.monotonic() + 10
            while (budget := (await client.get(f"http://{admin}/budget")).json())["predicted"] is None:
                assert time.monotonic() < deadline, budget
                await asyncio.sleep(0.1)
        assert budget["model"] == {
            "requested": "acme/llama-next-8b",
            "resolved_from": "hf-cache",
            "error": None,
        }
        assert budget["predicted"]["kv_pool_tokens"] > 0
    finally:
        events = await _stop(proc)
    assert events.count("model_unresolved") == 1  # said once, not once per retry
    assert "model_resolved" in events


async def test_run_budgets_a_drafter_once_the_cache_has_its_config(
    fake_vllm: FakeVllm, tmp_path: Path
) -> None:
    """An EAGLE-3 head vLLM has not downloaded yet: predicted without it (and said why), then with it."""
    cache, drafter = _empty_hf_cache(tmp_path), "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    spec = json.dumps({"method": "eagle3", "model": drafter, "num_speculative_tokens": 3})
    admin, _, proc = await _run_offline(
        fake_vllm, cache, "--model", "llama-3.1-8b", "--speculative-config", spec
    )
    try:
        await _wait_for_admin("http://" + admin)
        async with httpx.AsyncClient(timeout=10) as client:
            predicted = await _prediction(client, admin, lambda p: p is not None)  # after the first scrape
            assert "drafter_bytes" not in predicted["vllm_profile"]
            diagnoses = (await client.get(f"http://{admin}/budget")).json()["diagnoses"]
            assert "drafter-unresolved" in [d["id"] for d in diagnoses]
            active = await _metric_labelled(
                f"http://{admin}", "kv_sidecar_diagnosis_active", 'id="drafter-unresolved"'
            )
            assert active == 1
            assert any("not modelled" in note and "HF_HUB_OFFLINE" in note for note in predicted["notes"])
            config = (DRAFTERS / "yuhuili--EAGLE3-LLaMA3.1-Instruct-8B.json").read_text()
            add_model(cache, drafter, {"config.json": config})  # vLLM has read the drafter's config
            predicted = await _prediction(client, admin, lambda p: "drafter_bytes" in p["vllm_profile"])
            cleared = (await client.get(f"http://{admin}/budget")).json()["diagnoses"]
        assert predicted["vllm_profile"]["drafter_bytes"] == 849_635_328
        assert not any("not modelled" in note for note in predicted["notes"])
        assert "drafter-unresolved" not in [d["id"] for d in cleared]
    finally:
        events = await _stop(proc)
    assert events.count("drafter_unresolved") == 1  # said once, not once per retry
    assert "drafter_resolved" in events


async def _prediction(client: httpx.AsyncClient, admin: str, ready: Callable[[Any], bool]) -> Any:
    """``/budget``'s prediction once ``ready`` says so (within 10 s)."""
    deadline = time.monotonic() + 10
    while not ready(predicted := (await client.get(f"http://{admin}/budget")).json()["predicted"]):
        assert time.monotonic() < deadline, predicted
        await asyncio.sleep(0.1)
    return predicted


async def _metric_labelled(url: str, name: str, labels: str) -> float | None:
    async with httpx.AsyncClient() as client:
        text = (await client.get(url + "/metrics")).text
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.split()[1])
    return None


async def test_plan_reads_a_model_outside_the_catalog_from_the_hf_cache_offline(tmp_path: Path) -> None:
    add_model(tmp_path / "hub", "acme/llama-next-8b", {"config.json": TINY_CONFIG})
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    proc = await asyncio.create_subprocess_exec(
        *KV_SIDECAR, "plan", "--model", "acme/llama-next-8b", "--gpu", "l4", "--max-model-len", "1024", "--format", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 0, err.decode()
    assert (
        json.loads(out)["kv_bytes_per_token"] == 512
    )  # the tiny model: 2 layers x K,V x 1 head x 64 x 2 bytes
