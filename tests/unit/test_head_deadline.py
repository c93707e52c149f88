"""The request-head deadline at its boundaries, on a fake transport (no sockets)."""

from __future__ import annotations

import asyncio

from sidecar.server.connection import HeadDeadline, ScrapePage


class Inner(asyncio.Protocol):
    def __init__(self) -> None:
        self.received = b""
        self.eof = False

    def data_received(self, data: bytes) -> None:
        self.received += data

    def eof_received(self) -> bool | None:
        self.eof = True
        return None


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False
        self.buffered = 0  # what get_write_buffer_size reports

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return self.buffered


def guarded(timeout: float, *, page: bytes | None = None) -> tuple[HeadDeadline, Inner, Transport, list[int]]:
    inner, transport, timeouts = Inner(), Transport(), []
    scrape = ScrapePage(lambda: page or b"", "text/plain; version=0.0.4") if page is not None else None
    guard = HeadDeadline(inner, timeout, {}, lambda: timeouts.append(1), scrape)
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


SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: pod\r\n\r\n"
PAGE = b"vllm:num_requests_waiting 0.0\n"


def answers(written: bytes) -> list[bytes]:
    """The bodies of the 200 answers in ``written``, in order."""
    return [part.split(b"\r\n\r\n", 1)[1][: len(PAGE)] for part in written.split(b"HTTP/1.1 200 OK")[1:]]


async def test_scrapes_on_a_scrape_only_connection_are_answered_by_the_guard() -> None:
    guard, inner, transport, _ = guarded(0.05, page=PAGE)
    guard.data_received(SCRAPE)
    guard.data_received(SCRAPE + SCRAPE)  # pipelined: both, in order
    assert answers(transport.written) == [PAGE, PAGE, PAGE]
    assert b"Server: kv-sidecar" in transport.written
    assert (inner.received, transport.closed) == (b"", False)  # aiohttp saw nothing; kept alive


async def test_a_scrape_head_in_pieces_is_held_then_answered() -> None:
    guard, inner, transport, timeouts = guarded(0.05, page=PAGE)
    for byte in SCRAPE:
        guard.data_received(bytes([byte]))
    assert answers(transport.written) == [PAGE]
    await asyncio.sleep(0.1)  # the head arrived in time: its clock stopped
    assert (inner.received, transport.closed, timeouts) == (b"", False, [])


async def test_a_scrape_head_that_never_ends_is_cut_after_the_timeout() -> None:
    guard, inner, transport, timeouts = guarded(0.05, page=PAGE)
    guard.data_received(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(0.1)
    assert transport.written.startswith(b"HTTP/1.1 408")
    assert (transport.closed, timeouts, inner.received) == (True, [1], b"")


async def test_anything_else_hands_the_connection_and_its_held_bytes_to_aiohttp_for_good() -> None:
    guard, inner, transport, _ = guarded(0.05, page=PAGE)
    guard.data_received(b"GET /v")  # could still have been /metrics... until the next byte
    guard.data_received(b"1/models HTTP/1.1\r\n\r\n")
    assert inner.received == b"GET /v1/models HTTP/1.1\r\n\r\n"
    guard.request_finished()
    guard.data_received(SCRAPE)  # aiohttp has this connection now: its route answers
    assert inner.received.endswith(SCRAPE)
    assert transport.written == b""


async def test_a_request_after_a_scrape_goes_to_aiohttp_with_what_follows() -> None:
    guard, inner, transport, _ = guarded(0.05, page=PAGE)
    post = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    guard.data_received(SCRAPE + post)
    assert answers(transport.written) == [PAGE]
    assert inner.received == post


async def test_connection_close_is_honoured() -> None:
    guard, _, transport, _ = guarded(0.05, page=PAGE)
    guard.data_received(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert answers(transport.written) == [PAGE]
    assert b"Connection: close" in transport.written
    assert transport.closed


async def test_held_bytes_reach_aiohttp_before_an_eof() -> None:
    guard, inner, _, _ = guarded(0.05, page=PAGE)
    guard.data_received(b"GET /metrics HTTP/1.1\r\n")
    guard.eof_received()
    assert (inner.received, inner.eof) == (b"GET /metrics HTTP/1.1\r\n", True)


async def test_a_client_that_does_not_read_its_answers_is_left_to_aiohttp() -> None:
    guard, inner, transport, _ = guarded(0.05, page=PAGE)
    transport.buffered = 2 << 20  # two MiB of answers not yet read
    guard.data_received(SCRAPE)
    assert (transport.written, inner.received) == (b"", SCRAPE)


async def test_without_a_page_every_byte_goes_to_aiohttp() -> None:
    guard, inner, transport, _ = guarded(0.05)
    guard.data_received(SCRAPE)
    assert (transport.written, inner.received) == (b"", SCRAPE)
