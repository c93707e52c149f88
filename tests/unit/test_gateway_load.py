"""The gateway load rule at its boundaries (``sidecar.server.gateway.gateway_load``)."""

from __future__ import annotations

import pytest

from sidecar.server.gateway import GatewayLoad, gateway_load

CASES = [
    # engine waiting, running, kv | sidecar queued, inflight, reserved share -> queued, running, kv
    pytest.param((0.0, 4.0, 0.3), (0, 4, None), (0.0, 4.0, 0.3), id="calm: the engine's figures"),
    pytest.param((0.0, 4.0, 0.3), (7, 4, None), (7.0, 4.0, 0.3), id="the sidecar's queue is added"),
    pytest.param((2.0, 4.0, 0.3), (7, 5, None), (9.0, 4.0, 0.3), id="engine waiting plus sidecar queue"),
    pytest.param((0.0, 4.0, 0.3), (0, 4, 0.8), (0.0, 4.0, 0.8), id="a larger reservation wins"),
    pytest.param((0.0, 4.0, 0.9), (0, 4, 0.5), (0.0, 4.0, 0.9), id="a larger engine gauge wins"),
    pytest.param((0.0, 4.0, 0.3), (0, 4, 1.7), (0.0, 4.0, 1.0), id="over-reserved is capped at 1"),
    pytest.param((None, None, None), (3, 2, None), (3.0, 2.0, 0.0), id="no engine page: the sidecar's own"),
    pytest.param((None, None, None), (0, 2, 0.25), (0.0, 2.0, 0.25), id="no engine gauge: the reservation"),
    pytest.param((0.0, 1.0, float("nan")), (0, 1, None), (0.0, 1.0, 0.0), id="a NaN gauge is unknown"),
]


@pytest.mark.parametrize(("engine", "sidecar", "expected"), CASES)
def test_gateway_load(
    engine: tuple[float | None, float | None, float | None],
    sidecar: tuple[int, int, float | None],
    expected: tuple[float, float, float],
) -> None:
    load = gateway_load(
        engine_waiting=engine[0],
        engine_running=engine[1],
        engine_kv_usage=engine[2],
        sidecar_queued=sidecar[0],
        sidecar_inflight=sidecar[1],
        reserved_share=sidecar[2],
    )
    assert load == GatewayLoad(*expected)
