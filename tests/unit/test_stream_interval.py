"""A stream interval above one: vLLM streams an event per that many tokens, so events no longer count tokens.

vLLM's ``--stream-interval`` (vllm-project/vllm#27869) and, in 0.32, a request's own ``stream_interval`` (the
larger wins: ``RequestState.from_new_request`` in ``vllm/v1/engine/output_processor.py``) hold a stream's
events back until that many tokens have come, the first and the last excepted. On the real CPU server a
64-token answer at ``stream_interval`` 8 came as 9 events (``tests/e2e/test_stream_interval.py``). Counted as
tokens, a usage-less stream taught a learned length an eighth of the answer's, and the ledger would plan the
route's next requests that short.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry

from sidecar.admission.body import request_facts
from sidecar.admission.geometry import PoolView
from sidecar.admission.outputs import OutputSettings
from sidecar.admission.planner import CapacityPlanner
from sidecar.admission.tokens import EstimatingCounter
from sidecar.cli import build_parser
from sidecar.errors import UsageError
from tests.unit.test_backfill import fresh_controller, req

POOL = PoolView(blocks=15, block_size=128)
SAMPLES = "kv_sidecar_output_length_samples_total"


@pytest.mark.parametrize(
    ("engine", "request_interval", "counted", "learned"),
    [
        (1, 1, True, 100),  # an event a token: 40 events, one sample of 40 (x 2.5 after one answer)
        (1, 8, True, None),  # the request's interval: events are not tokens
        (4, 1, True, None),  # the engine's
        (4, 8, True, None),
        (4, 8, False, 100),  # usage counts tokens whatever the interval
        (1, 8, False, 100),
    ],
)
def test_counted_events_teach_nothing_above_an_interval_of_one(
    engine: int, request_interval: int, counted: bool, learned: int | None
) -> None:
    planner = CapacityPlanner(
        pool=lambda: POOL, max_model_len=lambda: 1024, outputs=OutputSettings(stream_interval=engine)
    )
    holding = planner.hold(req(24, 200, ignore_eos=False), (), 0.0, in_ledger=True)
    taught = planner.release(
        holding, 1, 1.0, completed=True, completion_tokens=40, key=("r", "m"), counted=counted,
        stream_interval=request_interval,
    )  # fmt: skip
    assert taught is (learned is not None)
    assert planner.outputs.bound("r", "m") == learned
    assert not planner.ledger.holdings


@pytest.mark.parametrize(
    ("path", "body", "interval"),
    [
        ("/v1/completions", {"prompt": "abcd", "stream_interval": 8}, 8),
        ("/v1/completions", {"prompt": "abcd", "stream_interval": "4"}, 4),  # coerced as pydantic's int is
        ("/v1/completions", {"prompt": "abcd"}, 1),
        ("/v1/completions", {"prompt": "abcd", "stream_interval": None}, 1),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream_interval": 3}, 3),
        ("/v1/responses", {"input": "hi", "stream_interval": 8}, 1),  # not a field of vLLM's Responses API
        ("/v1/responses", {"input": "hi", "stream_interval": "x"}, 1),  # ignored there, so never refused
    ],
)
def test_the_requests_stream_interval_is_read_where_vllm_reads_it(
    path: str, body: dict[str, object], interval: int
) -> None:
    assert request_facts(path, body, EstimatingCounter()).stream_interval == interval


@pytest.mark.parametrize(("interval", "stream"), [(1, 1), (8, 0)])
async def test_the_request_interval_travels_from_the_body_to_the_lesson(interval: int, stream: int) -> None:
    registry = CollectorRegistry()
    controller = fresh_controller(POOL, registry)
    facts = replace(req(24, 200, ignore_eos=False), tenant="t", wait_limit=5.0, stream_interval=interval)
    ticket = await controller.admit(facts)
    ticket.completion_tokens, ticket.counted = 40, True
    controller.release(ticket)
    assert registry.get_sample_value(SAMPLES, {"source": "stream"}) == stream


def test_the_engines_interval_is_a_run_flag() -> None:
    parser = build_parser()
    upstream = ["run", "--upstream", "http://127.0.0.1:8000"]
    assert parser.parse_args([*upstream, "--stream-interval", "10"]).stream_interval == 10
    with pytest.raises(UsageError, match="greater than zero"):
        parser.parse_args([*upstream, "--stream-interval", "0"])
    with pytest.raises(ValueError, match="stream interval"):
        OutputSettings(stream_interval=0)
