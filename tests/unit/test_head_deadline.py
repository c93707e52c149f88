"""The request-head deadline at its boundaries, on a fake transport (no sockets)."""

from __future__ import annotations

import asyncio

from sidecar.server.connection import HeadDeadline


class Inner(asyncio.Protocol):
    def __init__(self) -> None:
        self.received = b""

    def data_received(self, data: bytes) -> None:
        self.received += data


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def guarded(timeout: float) -> tuple[HeadDeadline, Inner, Transport, list[int]]:
    inner, transport, timeouts = Inner(), Transport(), []
    guard = HeadDeadline(inner, timeout, {}, lambda: timeouts.append(1))
    guard.connection_made(transport)
    return guard, inner, transport, timeouts


async def test_a_head_that_never_ends_is_cut_after_the_timeout() -> None:
    guard, inner, transport, timeouts = guarded(0.05)
    guard.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(0.1)
    assert transport.written.startswith(b"HTTP/1.1 408")
    assert transport.closed
    assert timeouts == [1]
    assert inner.received == b"GET / HTTP/1.1\r\nHost: x\r\n"  # aiohttp saw every byte


async def test_a_complete_head_meets_the_deadline_even_split_across_reads() -> None:
    """The blank line split over two reads still ends the head: a slow server never cuts it."""
    guard, _, transport, timeouts = guarded(0.05)
    guard.data_received(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r")
    guard.data_received(b"\n\r\n{}")
    await asyncio.sleep(0.1)  # no handler has started: the head's arrival is what counts
    assert (transport.written, transport.closed, timeouts) == (b"", False, [])


async def test_silence_between_requests_starts_no_clock() -> None:
    guard, _, transport, _ = guarded(0.05)
    guard.data_received(b"GET / HTTP/1.1\r\n\r\n")
    guard.request_finished()
    await asyncio.sleep(0.1)  # idle keep-alive
    assert not transport.closed
    guard.data_received(b"GET /again HTTP/1.1\r\n")  # the next head starts its own clock
    await asyncio.sleep(0.1)
    assert transport.closed


async def test_body_bytes_while_a_handler_runs_start_no_clock() -> None:
    guard, _, transport, _ = guarded(0.05)
    guard.data_received(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n")
    guard.data_received(b"01234")  # a slow body is the body timeout's business
    await asyncio.sleep(0.1)
    assert not transport.closed
