"""Speculative decoding on the real vLLM server: n-gram drafting of 3 tokens, the tiny model.

What the sidecar encodes (``sidecar/admission/geometry.py``), checked against the engine: the page names
``k`` by the positions of its per-position acceptance counter; a step gives a running sequence up to
``k + 1`` tokens (the suite's greedy answers of random weights repeat, so n-gram drafts are mostly
accepted); a stream sends an event per step at most, holding the step's tokens, so its events count
steps; and through the sidecar, which lets sequences grow ``k + 1`` tokens a step, a spike of growing
requests does not preempt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from sidecar.signals import parse_vllm_metrics
from tests.e2e.conftest import serve
from tests.e2e.spikes import straight_then_through
from tests.harness.spike import SpikeConfig, wait_idle
from tests.harness.vllm import VllmServer

pytestmark = pytest.mark.e2e

DRAFTS = 3
SPECULATIVE = json.dumps(
    {"method": "ngram", "num_speculative_tokens": DRAFTS, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
)
GROWING = SpikeConfig(
    seed=5, long_requests=6, short_requests=4, long_prompt=300, long_output=600, spread_seconds=0.1
)


@pytest.fixture(scope="module")
def drafting_server(
    vllm_env: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """The e2e engine's settings (16 blocks of 128, max_model_len 1024, 4 sequences) with n-gram drafting."""
    yield from serve(
        vllm_env, tiny_model, tmp_path_factory, "vllm-ngram.log", ("--speculative-config", SPECULATIVE)
    )


async def _steps(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as response:
        snapshot = parse_vllm_metrics(await response.text())
    assert snapshot.speculative_tokens == DRAFTS
    assert snapshot.iterations_total is not None
    return snapshot.iterations_total


async def test_a_step_gives_a_sequence_up_to_k_plus_one_tokens_and_one_stream_event(
    drafting_server: VllmServer,
) -> None:
    await wait_idle(drafting_server.url)
    body = {
        "model": "tiny",
        "prompt": [5, 6, 7] * 10,
        "max_tokens": 300,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as session:
        before = await _steps(session, drafting_server.url)
        events, tokens = 0, None
        async with session.post(drafting_server.url + "/v1/completions", json=body) as response:
            async for line in response.content:
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if chunk.get("choices"):
                    events += 1
        steps = await _steps(session, drafting_server.url) - before
    assert tokens == 300
    print(f"\n300 tokens in {steps:.0f} steps and {events} events")
    assert events <= steps + 1  # an event is at least a step (what the stream clock counts)
    assert events < 300 / 1.5  # ...and not a token: a step's event holds all the step gave
    assert 300 / (DRAFTS + 1) <= steps < 300 / 1.5  # more than one token a step, never more than k + 1


async def test_through_the_sidecar_growing_requests_do_not_preempt(
    drafting_server: VllmServer, tiny_model: Path
) -> None:
    _, proxied, layout = await straight_then_through(drafting_server.url, tiny_model, GROWING)
    assert isinstance(layout, dict)
    assert layout["speculative_tokens"] == DRAFTS
    assert proxied.preemptions == 0
