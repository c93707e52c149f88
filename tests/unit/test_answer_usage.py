"""An answer's length and prompt size on each generation route, from real vLLM 0.32.0 streams.

The Responses API and the Anthropic Messages API stream lifecycle events besides their tokens (11 events for a
3-token answer on /v1/responses, 8 on /v1/messages), and name their usage ``output_tokens`` and
``input_tokens``. Counted as steps, those events made the step clock's lower bound run ahead of the engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.admission.outcomes import Lane
from sidecar.admission.tickets import Ticket
from sidecar.server.wire import AnswerLength

DATA = Path(__file__).parents[1] / "data" / "vllm"
CHAT_STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":"c"}}]}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("size", [1, 7, 97, 100_000])  # chunks as the network cuts them
@pytest.mark.parametrize(
    ("route", "payload", "progress", "output", "prompt", "usage"),
    [
        ("/v1/chat/completions", CHAT_STREAM, 5, 4, None, False),  # events: steps, the length when no usage
        (
            "/v1/responses",
            (DATA / "vllm-0.32.0-cpu-tiny-responses-stream.txt").read_bytes(),
            None,
            3,
            19,
            True,
        ),
        ("/v1/messages", (DATA / "vllm-0.32.0-cpu-tiny-messages-stream.txt").read_bytes(), None, 3, 19, True),
        ("/v1/messages", b'{"usage":{"input_tokens":18,"output_tokens":5}}', None, 5, 18, True),
    ],
)
def test_each_routes_usage_is_read_and_only_openai_events_are_steps(
    route: str, payload: bytes, progress: int | None, output: int, prompt: int | None, usage: bool, size: int
) -> None:
    answer = AnswerLength(
        Ticket(lane=Lane.SHORT, reserved_tokens=0, admitted_at=0.0, route=route, stream=True)
    )
    reported = [answer.feed(payload[i : i + size]) for i in range(0, len(payload), size)]
    assert reported[-1] == progress
    assert (answer.completion_tokens(), answer.prompt_tokens(), answer.usage_seen) == (output, prompt, usage)
