"""decide, the pressure detector, the fair queue and the Retry-After estimates, at their boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.admission.decide import (
    Action,
    AdmissionConfig,
    AdmissionMode,
    AdmissionRequest,
    AdmissionView,
    OnPressure,
    decide,
    lane_of,
)
from sidecar.admission.outcomes import Lane, Reason
from sidecar.admission.pressure import PressureDetector, PressureSettings, PressureState, StaleMode, Staleness
from sidecar.admission.queue import FairQueue, QueueEntry, QueueFullError
from sidecar.admission.retry import (
    ServiceStats,
    clamp_retry_after,
    pressure_wait_estimate,
    queue_wait_estimate,
    usage_fall_rate,
)

# -- decide -------------------------------------------------------------------------------------------


def req(prompt: int, *, reserved: int | None = None, refusal: Reason | None = None) -> AdmissionRequest:
    return AdmissionRequest(prompt, reserved if reserved is not None else prompt + 16, refusal)


def view(**changes: object) -> AdmissionView:
    base = {
        "pressure": False,
        "draining": False,
        "max_model_len": 32768,
        "long_inflight": 0,
        "queued_in_lane": 0,
        "queue_has_room": True,
    }
    return AdmissionView(**{**base, **changes})  # type: ignore[arg-type]


CONFIG = AdmissionConfig(mode=AdmissionMode.LANES)
CAPACITY = AdmissionConfig()
CAP = AdmissionMode.CAPACITY


@pytest.mark.parametrize(
    ("prompt", "max_model_len", "configured", "lane"),
    [
        (16383, 32768, None, Lane.SHORT),
        (16384, 32768, None, Lane.LONG),  # exactly at half of max_model_len
        (16383, None, None, Lane.SHORT),
        (16384, None, None, Lane.LONG),  # 16384 when max_model_len is unknown
        (99, 32768, 100, Lane.SHORT),
        (100, 32768, 100, Lane.LONG),
    ],
)
def test_lanes(prompt: int, max_model_len: int | None, configured: int | None, lane: Lane) -> None:
    assert lane_of(prompt, AdmissionConfig(long_prompt_tokens=configured), max_model_len) is lane


def test_capacity_is_the_default() -> None:
    assert AdmissionConfig().mode is AdmissionMode.CAPACITY


@pytest.mark.parametrize(
    ("request_", "view_", "config", "expected"),
    [
        (req(100), view(), CONFIG, (Action.ADMIT, Lane.SHORT, Reason.ADMITTED)),
        (req(100, refusal=Reason.CONTEXT_LENGTH_EXCEEDED), view(), CONFIG,
         (Action.REFUSE, Lane.SHORT, Reason.CONTEXT_LENGTH_EXCEEDED)),  # the engine would refuse it: first
        (req(100, refusal=Reason.CONTEXT_LENGTH_EXCEEDED), view(draining=True), CONFIG,
         (Action.REFUSE, Lane.SHORT, Reason.CONTEXT_LENGTH_EXCEEDED)),
        (req(100), view(draining=True), CONFIG, (Action.REFUSE, Lane.SHORT, Reason.DRAINING)),
        (req(100), view(pressure=True), CONFIG, (Action.ADMIT, Lane.SHORT, Reason.ADMITTED)),
        (req(20000), view(pressure=True), CONFIG, (Action.QUEUE, Lane.LONG, Reason.QUEUED)),
        (req(20000), view(pressure=True), AdmissionConfig(on_pressure="reject"),
         (Action.REFUSE, Lane.LONG, Reason.KV_PRESSURE)),
        (req(20000), view(pressure=True, queue_has_room=False), CONFIG, (Action.REFUSE, Lane.LONG, Reason.QUEUE_FULL)),
        (req(20000), view(long_inflight=1), CONFIG, (Action.QUEUE, Lane.LONG, Reason.QUEUED)),
        (req(20000), view(long_inflight=1), AdmissionConfig(mode="lanes", long_lane_concurrency=2),
         (Action.ADMIT, Lane.LONG, Reason.ADMITTED)),
        (req(20000), view(queued_in_lane=1), CONFIG, (Action.QUEUE, Lane.LONG, Reason.QUEUED)),  # no overtaking
        (req(100, reserved=116), view(pool_tokens=1000, reserved_tokens=884, policy=AdmissionMode.TOKEN_BUDGET),
         AdmissionConfig(mode="token-budget"), (Action.ADMIT, Lane.SHORT, Reason.ADMITTED)),  # exactly fits
        (req(101, reserved=117), view(pool_tokens=1000, reserved_tokens=884, policy=AdmissionMode.TOKEN_BUDGET),
         AdmissionConfig(mode="token-budget"), (Action.QUEUE, Lane.SHORT, Reason.QUEUED)),
        (req(5000, reserved=5016), view(pool_tokens=1000, policy=AdmissionMode.TOKEN_BUDGET),
         AdmissionConfig(mode="token-budget"), (Action.ADMIT, Lane.SHORT, Reason.ADMITTED)),  # alone it runs
        # capacity: the ledger's answer, the pressure cap, and long requests as many as fit
        (req(20000), view(policy=CAP, long_inflight=3, fits=True), CAPACITY, (Action.ADMIT, Lane.LONG, Reason.ADMITTED)),
        (req(100), view(policy=CAP, fits=False), CAPACITY, (Action.QUEUE, Lane.SHORT, Reason.QUEUED)),
        (req(100), view(policy=CAP, inflight=3, concurrency_cap=3), CAPACITY, (Action.QUEUE, Lane.SHORT, Reason.QUEUED)),
        (req(100), view(policy=CAP, inflight=2, concurrency_cap=3), CAPACITY, (Action.ADMIT, Lane.SHORT, Reason.ADMITTED)),
        (req(100), view(policy=CAP, fits=False, queue_has_room=False), CAPACITY,
         (Action.REFUSE, Lane.SHORT, Reason.QUEUE_FULL)),
        (req(20000), view(long_inflight=1), CAPACITY, (Action.QUEUE, Lane.LONG, Reason.QUEUED)),  # fallback: lanes
    ],
)  # fmt: skip
def test_decide(
    request_: AdmissionRequest,
    view_: AdmissionView,
    config: AdmissionConfig,
    expected: tuple[Action, Lane, Reason],
) -> None:
    decision = decide(request_, view_, config)
    assert (decision.action, decision.lane, decision.reason) == expected


# -- pressure ---------------------------------------------------------------------------------------


def run_samples(samples: list[tuple[float, float | None]], **settings: object) -> PressureDetector:
    detector = PressureDetector(PressureSettings(**settings))  # type: ignore[arg-type]
    for at, usage in samples:
        detector.observe(at, usage)
    return detector


@pytest.mark.parametrize(
    ("samples", "state"),
    [
        ([(0, 0.85), (5.0, 0.85)], PressureState.PRESSURE),  # exactly at threshold for exactly the window
        ([(0, 0.85), (4.999, 0.9)], PressureState.NORMAL),  # just short of the window
        ([(0, 0.849), (5, 0.9), (9.9, 0.9)], PressureState.NORMAL),  # clock starts at the first sample above
        ([(0, 0.9), (2, 0.5), (4, 0.9), (8, 0.9)], PressureState.NORMAL),  # a dip restarts the clock
        ([(0, 0.9), (2, 0.5), (4, 0.9), (9, 0.9)], PressureState.PRESSURE),
        ([(0, 1.0), (5, 1.0), (6, 0.8), (11, 0.79)], PressureState.PRESSURE),  # 0.80 is not below release
        ([(0, 1.0), (5, 1.0), (6, 0.79), (11, 0.79)], PressureState.NORMAL),  # released after the window
        ([(0, 1.0), (5, 1.0), (6, 0.79), (10.99, 0.79)], PressureState.PRESSURE),
        ([(0, 1.0), (5, 1.0), (6, 0.82), (20, 0.82)], PressureState.PRESSURE),  # hysteresis: no flapping
    ],
)
def test_pressure_transitions(samples: list[tuple[float, float]], state: PressureState) -> None:
    assert run_samples(samples).state is state


def test_transitions_are_counted() -> None:
    detector = run_samples([(0, 1.0), (5, 1.0), (6, 0.1), (11, 0.1), (12, 1.0), (17, 1.0)])
    assert (detector.state, detector.transitions) == (PressureState.PRESSURE, 3)


@pytest.mark.parametrize(
    ("policy", "raw", "effective"),
    [
        (StaleMode.OPEN, PressureState.PRESSURE, PressureState.NORMAL),
        (StaleMode.CLOSED, PressureState.NORMAL, PressureState.PRESSURE),
    ],
)
def test_stale_policy(policy: StaleMode, raw: PressureState, effective: PressureState) -> None:
    samples = [(0.0, 1.0), (5.0, 1.0)] if raw is PressureState.PRESSURE else [(0.0, 0.1)]
    detector = run_samples(samples)
    assert detector.effective(False, policy) is raw
    detector.observe(6.0, None)
    assert detector.state is raw  # stale samples do not move the machine
    assert detector.effective(True, policy) is effective
    detector.observe(7.0, 0.5, stale=True)
    assert detector.state is raw


@pytest.mark.parametrize(
    ("up", "age", "stale"),
    [(True, 3.0, False), (True, 3.001, True), (True, None, True), (False, 0.1, True), (None, 0.1, True)],
)
def test_staleness_boundary(up: bool | None, age: float | None, stale: bool) -> None:
    assert Staleness(after=3.0).is_stale(up, age) is stale


# -- queue ------------------------------------------------------------------------------------------


def entry(tenant: str, name: str, priority: int = 0, tokens: int = 1) -> QueueEntry[str]:
    return QueueEntry(priority=priority, tenant=tenant, tokens=tokens, payload=name)


def drain_names(queue: FairQueue[str]) -> list[str]:
    return [e.payload for e in queue.drain()]


def test_round_robin_between_tenants() -> None:
    queue: FairQueue[str] = FairQueue(100, 1000)
    for name in ("a1", "a2", "a3"):
        queue.push(entry("a", name))
    queue.push(entry("b", "b1"))
    queue.push(entry("c", "c1"))
    queue.push(entry("b", "b2"))
    assert drain_names(queue) == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_priority_bands_first_lower_number() -> None:
    queue: FairQueue[str] = FairQueue(100, 1000)
    queue.push(entry("a", "late", priority=5))
    queue.push(entry("a", "urgent", priority=-1))
    queue.push(entry("b", "normal", priority=0))
    assert drain_names(queue) == ["urgent", "normal", "late"]


def test_limits_by_entries_and_tokens() -> None:
    queue: FairQueue[str] = FairQueue(2, 100)
    queue.push(entry("a", "x", tokens=60))
    with pytest.raises(QueueFullError):
        queue.push(entry("a", "y", tokens=41))  # 101 tokens
    queue.push(entry("a", "y", tokens=40))  # exactly 100
    with pytest.raises(QueueFullError):
        queue.push(entry("a", "z", tokens=0))  # 3 entries
    assert (len(queue), queue.tokens) == (2, 100)


def test_remove_from_the_middle_and_position() -> None:
    queue: FairQueue[str] = FairQueue(100, 1000)
    entries = [entry("a", f"a{i}") for i in range(3)] + [entry("b", "b0")]
    for item in entries:
        queue.push(item)
    assert [queue.position(e) for e in entries] == [0, 2, 3, 1]
    assert queue.remove(entries[1])
    assert not queue.remove(entries[1])
    assert (len(queue), queue.tokens) == (3, 3)
    assert drain_names(queue) == ["a0", "b0", "a2"]


def test_mass_removal_is_compacted() -> None:
    queue: FairQueue[str] = FairQueue(100_000, 10**9)
    head = entry("a", "head")
    queue.push(head)
    for round_ in range(50):
        batch = [entry("a", f"x{round_}-{i}") for i in range(100)]
        for item in batch:
            queue.push(item)
        for item in batch:
            queue.remove(item)
    stored = sum(len(fifo) for band in queue._bands.values() for fifo in band.values())  # noqa: SLF001
    assert len(queue) == 1
    assert stored < 200  # removed entries do not pile up behind a head that never moves
    assert queue.peek() is head


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(-1, 1), st.booleans()), max_size=60))
def test_queue_properties(ops: list[tuple[str, int, bool]]) -> None:
    queue: FairQueue[int] = FairQueue(1000, 10**6)
    live: list[QueueEntry[int]] = []
    for index, (tenant, priority, remove_one) in enumerate(ops):
        item = QueueEntry(priority=priority, tenant=tenant, tokens=index, payload=index)
        queue.push(item)
        live.append(item)
        if remove_one and live:
            victim = live.pop(index % len(live))
            assert queue.remove(victim)
    assert len(queue) == len(live)
    assert queue.tokens == sum(e.tokens for e in live)
    order = queue.drain()
    assert sorted(e.payload for e in order) == sorted(e.payload for e in live)
    assert [e.priority for e in order] == sorted(e.priority for e in order)  # bands in order
    for tenant in "abc":  # FIFO within a tenant and band
        for priority in (-1, 0, 1):
            mine = [e.payload for e in order if e.tenant == tenant and e.priority == priority]
            assert mine == sorted(mine)


# -- Retry-After --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "header"), [(0.0, 1), (1.0, 1), (1.01, 2), (299.5, 300), (1e9, 300), (float("nan"), 300)]
)
def test_clamp(seconds: float, header: int) -> None:
    assert clamp_retry_after(seconds) == header


def test_queue_estimate_uses_observed_service_time() -> None:
    stats = ServiceStats()
    assert queue_wait_estimate(0, 1, stats, fallback=10.0) == 10.0
    stats.record(4.0)
    assert queue_wait_estimate(2, 1, stats, fallback=10.0) == 12.0
    assert queue_wait_estimate(2, 2, stats, fallback=10.0) == 6.0
    stats.record(14.0)
    assert stats.mean_seconds == pytest.approx(6.0)


def test_usage_fall_rate_and_pressure_estimate() -> None:
    falling = [(float(t), 1.0 - 0.01 * t) for t in range(11)]
    rate = usage_fall_rate(falling, now=10.0)
    assert rate == pytest.approx(0.01)
    assert usage_fall_rate([(float(t), 0.9) for t in range(5)], now=5.0) is None
    assert usage_fall_rate([(0.0, 0.9)], now=0.0) is None
    assert pressure_wait_estimate(0.9, 0.01, 0.8, 5.0, ServiceStats()) == pytest.approx(15.0)
    long_lane = ServiceStats()
    long_lane.record(7.0)
    assert pressure_wait_estimate(0.9, None, 0.8, 5.0, long_lane) == 12.0
    assert pressure_wait_estimate(None, None, 0.8, 5.0, ServiceStats()) == 10.0


def test_reject_mode_refuses_under_pressure_even_with_a_queue() -> None:
    decision = decide(
        req(20000), view(pressure=True, queued_in_lane=3), AdmissionConfig(on_pressure="reject")
    )
    assert (decision.action, decision.reason) == (Action.REFUSE, Reason.KV_PRESSURE)


def test_the_pressure_action_is_an_enum_read_from_its_flag_value() -> None:
    assert AdmissionConfig(on_pressure="reject").on_pressure is OnPressure.REJECT  # type: ignore[arg-type]
    assert AdmissionConfig().on_pressure is OnPressure.QUEUE
    with pytest.raises(ValueError, match="queue, reject"):
        AdmissionConfig(on_pressure="drop")  # type: ignore[arg-type]
