"""vLLM served with ``--tokenizer`` from the HF cache: the sidecar told the same counts chats as vLLM does.

vLLM 0.32.0 loads the tokenizer and its chat templates from ``--tokenizer`` (a Hub id here, offline from a
real HF cache layout), not from ``--model``. The tokenizer repository's template adds a preamble the model's
own lacks, so a sidecar reading ``--model``'s folder counted every chat short and called the count exact.
Here ``kv-sidecar run`` runs as a process with the same flags and cache: with ``--tokenizer`` its counts agree
with vLLM's usage on every chat (its count audit: agree, never disagree), without it they disagree.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sidecar.admission.body import request_facts
from sidecar.admission.conversation import EngineChat
from sidecar.admission.recount import tokenize_bodies
from sidecar.budget.hub import tokenizer_folder
from sidecar.server.counting import CountingFiles
from tests.e2e.conftest import serve
from tests.harness.vllm import VllmServer, free_port
from tests.hf_cache import add_model
from tests.integration.test_cli_engine import KV_SIDECAR, _wait_for_admin
from tests.unit.test_separate_tokenizer import PREAMBLE, tokenizer_files

pytestmark = pytest.mark.e2e
TOKENIZER = "acme/tiny-tokenizer"
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
CHATS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "what is the weather"}]},
    {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "the KV cache grows"},
        ]
    },
    {"messages": [{"role": "user", "content": "and tomorrow?"}], "tools": [WEATHER], "tool_choice": "none"},
]


@pytest.fixture(scope="module")
def hf_home(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF cache holding the tokenizer repository vLLM is told, as ``vllm serve`` leaves it after a download."""
    home = tmp_path_factory.mktemp("hf-home")
    template = PREAMBLE + (tiny_model / "chat_template.jinja").read_text()
    add_model(home / "hub", TOKENIZER, tokenizer_files(tiny_model, template))
    return home


@pytest.fixture(scope="module")
def tokenizer_server(
    vllm_env: Path, tiny_model: Path, hf_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    yield from serve(
        vllm_env, tiny_model, tmp_path_factory, "vllm-separate-tokenizer.log",
        extra_args=("--tokenizer", TOKENIZER), env={"HF_HOME": str(hf_home)},
    )  # fmt: skip


async def test_vllm_counts_chats_with_its_tokenizer_flag_and_so_does_the_sidecar(
    tokenizer_server: VllmServer, tiny_model: Path, hf_home: Path
) -> None:
    folder = tokenizer_folder(TOKENIZER, cache_dir=hf_home / "hub", offline=True)
    told = CountingFiles(str(folder), str(tiny_model), TOKENIZER).counter(EngineChat())
    own = CountingFiles(str(tiny_model)).counter(EngineChat())
    async with httpx.AsyncClient(base_url=tokenizer_server.url, timeout=30) as client:
        for chat in CHATS:
            body = {"model": "tiny", "max_tokens": 1, **chat}
            answer = await client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            vllm = answer.json()["usage"]["prompt_tokens"]
            assert request_facts("/v1/chat/completions", body, told).prompts == (vllm,)
            assert request_facts("/v1/chat/completions", body, own).prompts[0] < vllm - 10  # the preamble
            asks = tokenize_bodies("/v1/chat/completions", body, EngineChat(), (0,))
            assert asks is not None
            assert (await client.post("/tokenize", json=asks[0])).json()["count"] == vllm


async def _audit_through(server: VllmServer, hf_home: Path, model: Path, *flags: str) -> dict[str, Any]:
    """``kv-sidecar run`` with ``flags`` in front of ``server``, offline over ``hf_home``; its count checks."""
    admin, proxy = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home), "HF_HUB_CACHE": str(hf_home / "hub")}
    proc = await asyncio.create_subprocess_exec(
        *KV_SIDECAR, "run", "--upstream", server.url, "--listen", proxy, "--admin-listen", admin,
        "--gpu-memory", "24GiB", "--nvml", "off", "--model", str(model), "--max-num-seqs", "4", *flags,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        await _wait_for_admin("http://" + admin)
        async with httpx.AsyncClient(timeout=30) as client:
            for chat in CHATS:
                body = {"model": "tiny", "max_tokens": 1, **chat}
                answer = await client.post(f"http://{proxy}/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
            status = (await client.get(f"http://{admin}/status")).json()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=15)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert not [line for line in err.decode().splitlines() if json.loads(line).get("level") == "error"]
    return dict(status["admission"]["prompt_count_checks"])


async def test_the_sidecar_told_vllms_tokenizer_agrees_with_every_answer_and_without_it_does_not(
    tokenizer_server: VllmServer, tiny_model: Path, hf_home: Path
) -> None:
    told = await _audit_through(tokenizer_server, hf_home, tiny_model, "--tokenizer", TOKENIZER)
    assert told["counting"]["tokenizer"] == TOKENIZER
    assert (told["agree"], told["disagree"]) == (len(CHATS), 0)
    own = await _audit_through(tokenizer_server, hf_home, tiny_model)
    assert own["disagree"] >= 1  # the model's own template: vLLM's usage says the count was wrong
    assert own["distrusted"]  # and the route stops refusing on its counts
