"""``kv-sidecar run --tokenizer``: vLLM's separate tokenizer, resolved from the HF cache as vLLM fills it.

A real ``run`` process, offline over a real HF cache layout, in front of the fake vLLM: until the tokenizer's
repository is in the cache (at the revision told), prompts are counted by estimate and ``/status`` says why;
traffic flows; once vLLM has downloaded it, the sidecar counts with it. The real vLLM server with
``--tokenizer`` is in ``tests/e2e/test_separate_tokenizer.py``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fake_vllm import FakeVllm
from tests.hf_cache import add_model
from tests.integration.test_cli_engine import _empty_hf_cache, _run_offline, _stop, _wait_for_admin
from tests.unit.test_body_parity import model_dir  # noqa: F401 - the fixture
from tests.unit.test_separate_tokenizer import PREAMBLE, model_template, tokenizer_files

pytestmark = pytest.mark.integration


async def _counting(client: httpx.AsyncClient, admin: str) -> dict[str, Any]:
    status = (await client.get(f"http://{admin}/status")).json()
    return dict(status["admission"]["prompt_count_checks"]["counting"])


async def test_run_counts_with_vllms_tokenizer_once_the_cache_has_it_at_the_revision_told(
    fake_vllm: FakeVllm,
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
) -> None:
    cache = _empty_hf_cache(tmp_path)
    files = tokenizer_files(model_dir, PREAMBLE + model_template(model_dir))
    admin, proxy, proc = await _run_offline(
        fake_vllm, cache, "--model", str(model_dir), "--tokenizer", "acme/tok", "--tokenizer-revision", "v2"
    )
    try:
        await _wait_for_admin("http://" + admin)
        async with httpx.AsyncClient(timeout=10) as client:
            counting = await _counting(client, admin)
            assert (counting["counter"], counting["tokenizer"]) == ("estimate", "acme/tok")
            assert counting["tokenizer_unresolved"].startswith("acme/tok is not in")
            answer = await client.post(
                f"http://{proxy}/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
            assert answer.status_code == 200  # traffic flows while the tokenizer is missing
            add_model(cache, "acme/tok", files)  # its main branch: not the revision vLLM was told
            await asyncio.sleep(1.0)  # three retries
            assert (await _counting(client, admin))["counter"] == "estimate"
            add_model(cache, "acme/tok", files, branch="v2")  # vLLM finished downloading
            deadline = time.monotonic() + 10
            while (counting := await _counting(client, admin))["counter"] == "estimate":
                assert time.monotonic() < deadline, counting
                await asyncio.sleep(0.1)
        assert counting == {
            "counter": "tokenizer", "texts_exact": True, "chats_exact": True, "tokenizer_mode": "hf",
            "tokenizer": "acme/tok",
        }  # fmt: skip
    finally:
        events = await _stop(proc)
    assert events.count("tokenizer_unresolved") == 1  # said once, not once per retry
    assert "tokenizer_resolved" in events
