r"""A deadline on request heads, which aiohttp does not have: slow clients cannot hold connections.

Theory of operation
-------------------
aiohttp's server limits the size of a request line and of each header, and closes idle keep-alive
connections, but it never limits how long a request's head may take to arrive: a client that sends
``GET / HTTP/1.1\r\n`` and then one byte every few seconds ("slowloris") holds its connection and
a parser for as long as it likes, and a few thousand such clients exhaust the sidecar's file
descriptors. (Bodies are bounded already: the proxy reads them within ``--body-timeout``.)

:class:`HeadDeadline` wraps the protocol aiohttp's server creates for each connection, passing
every call through. A connection is *between requests* when it opens and whenever a handler has
finished; the first bytes that arrive between requests start a timer of ``timeout`` seconds, and
the head's end (its blank line, found across reads) stops it, as does the handler starting. The
deadline is on the client's bytes, not on the server's work: a head that arrived in time is never
cut because a loaded event loop was slow to start its handler. When the timer fires, the
client gets ``408 Request Timeout`` with ``Connection: close`` and the connection is closed. An
idle keep-alive connection (no bytes at all) starts no timer: closing those is aiohttp's keep-alive
timeout's job. Bytes that arrive while a handler runs (a pipelined next request, a body) start no
timer either; the next bytes after the handler has finished do.

On the proxy port the guard also answers a gateway's scrapes itself, in the callback that received them,
while aiohttp has not seen a byte of the connection (:mod:`sidecar.server.scrape_path` says when and why).
Bytes of a scrape head still arriving are held, under the same deadline.

The handler's start and end are signalled by :func:`head_middleware` (an aiohttp middleware on both
the proxy and the admin application), which finds the connection's guard by its transport.
:func:`serve_guarded` binds a listening socket whose connections are so wrapped; aiohttp's runner
still tracks and shuts down every connection.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from sidecar.admission.outcomes import Reason
from sidecar.server.scrape_path import Scrape, Undecided, read_scrape, scrape_response


@dataclass(frozen=True, slots=True)
class ScrapePage:
    """What a connection answers a gateway's scrape with, in its own callback (see ``scrape_path``)."""

    render: Callable[[], bytes]  # the page now, from memory
    content_type: str
    max_buffered: int = 1 << 20  # unread answers on one connection past which aiohttp takes it over


def timeout_response(timeout: float) -> bytes:
    """The bytes of the 408: the sidecar's usual error body and reason header, and ``Connection: close``."""
    reason = Reason.HEADER_TIMEOUT
    message = f"the request head did not arrive within {timeout:g}s"
    body = json.dumps(
        {"error": {"message": message, "type": reason.error_type, "param": None, "code": reason}}
    )
    head = (
        f"HTTP/1.1 {reason.status} Request Timeout\r\nContent-Type: application/json\r\n"
        f"X-KV-Sidecar-Reason: {reason}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return (head + body).encode()


class HeadDeadline(asyncio.Protocol):
    """One connection: aiohttp's protocol, with a deadline on each request head."""

    def __init__(
        self,
        inner: asyncio.Protocol,
        timeout: float,
        guards: dict[object, HeadDeadline],
        on_timeout: Callable[[], None],
        scrape_page: ScrapePage | None = None,
    ) -> None:
        self._inner = inner
        self._timeout = timeout
        self._guards = guards
        self._on_timeout = on_timeout
        self._scrape_page = scrape_page  # None once aiohttp has the connection (or on a port without one)
        self._held = b""  # bytes of a possible scrape head, not yet given to aiohttp
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._between_requests = True
        self._tail = b""  # the last bytes of the head so far, to find its end across reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Register the connection and hand it to aiohttp."""
        self._transport = cast("asyncio.Transport", transport)  # a stream server's (uvloop's is no subclass)
        self._guards[transport] = self
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        """Start the head's clock on its first bytes, stop it at its blank line, then pass the bytes on."""
        if self._scrape_page is not None:
            data = self._answer_scrapes(self._held + data)
            if not data:
                return
        if self._between_requests:
            seen = self._tail + data if self._tail else data
            if b"\r\n\r\n" in seen or b"\n\n" in seen:  # the head is complete: the deadline is met
                self.request_started()  # (a head that came whole in one read never needed a timer)
            else:
                if self._timer is None:
                    self._timer = asyncio.get_running_loop().call_later(self._timeout, self._expired)
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        """Passed through (with any held bytes first: aiohttp answers a cut-off head as it always did)."""
        self._hand_over()
        return self._inner.eof_received()

    def _answer_scrapes(self, data: bytes) -> bytes:
        """Answer the scrapes at the front of ``data`` (``scrape_path``); the rest is for aiohttp.

        Returns the bytes aiohttp is to get: empty while a scrape head is still arriving (the bytes are held,
        under the head's deadline) or when everything was a scrape; all of them, for good, otherwise.
        """
        page, transport = self._scrape_page, self._transport
        assert page is not None  # noqa: S101 - only called while the connection may be scraped
        assert transport is not None  # noqa: S101 - and is open
        while data:
            head = read_scrape(data)
            if head is Undecided.NEED_MORE:
                self._held = data
                if self._timer is None:
                    self._timer = asyncio.get_running_loop().call_later(self._timeout, self._expired)
                return b""
            if head is Undecided.TO_AIOHTTP or transport.get_write_buffer_size() > page.max_buffered:
                self._scrape_page, self._held = None, b""
                return data
            assert isinstance(head, Scrape)  # noqa: S101 - the enum's two values are handled above
            self._stop_timer()
            transport.write(
                scrape_response(
                    page.render(),
                    page.content_type,
                    keep_alive=head.keep_alive,
                    http10=head.http10,
                    now=time.time(),
                )
            )
            if not head.keep_alive:
                self._held = b""
                transport.close()
                return b""
            data = data[head.length :]
        self._held = b""
        return b""

    def _hand_over(self) -> None:
        """Give aiohttp the connection and the bytes held for it."""
        held, self._held, self._scrape_page = self._held, b"", None
        if held:
            self._inner.data_received(held)

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection; aiohttp cleans up its side."""
        self._stop_timer()
        if self._transport is not None:
            self._guards.pop(self._transport, None)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """Passed through (aiohttp's flow control)."""
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        """Passed through (aiohttp's flow control)."""
        self._inner.resume_writing()

    def request_started(self) -> None:
        """The head is complete (its blank line arrived, or its handler runs): the deadline is met."""
        self._between_requests = False
        self._tail = b""
        self._stop_timer()

    def request_finished(self) -> None:
        """The handler is done: the next bytes begin the next request's head."""
        self._between_requests = True

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if not self._between_requests or self._transport is None or self._transport.is_closing():
            return
        self._on_timeout()
        self._transport.write(timeout_response(self._timeout))
        self._transport.close()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def head_middleware(guards: dict[object, HeadDeadline]) -> Any:
    """An aiohttp middleware telling each connection's guard when its handler starts and ends."""

    @web.middleware
    async def mark(request: web.Request, handler: Handler) -> web.StreamResponse:
        guard = guards.get(request.transport) if request.transport is not None else None
        if guard is not None:
            guard.request_started()
        try:
            return await handler(request)
        finally:
            if guard is not None:
                guard.request_finished()

    return mark


async def serve_guarded(
    runner: web.BaseRunner,
    host: str,
    port: int,
    *,
    head_timeout: float,
    guards: dict[object, HeadDeadline],
    on_timeout: Callable[[], None],
    scrape_page: ScrapePage | None = None,
) -> asyncio.Server:
    """Listen on ``host:port``; each connection is aiohttp's protocol wrapped in a :class:`HeadDeadline`.

    With ``scrape_page``, a gateway's ``GET /metrics`` on a scrape-only connection is answered by the guard
    itself (:mod:`sidecar.server.scrape_path`).
    """
    server = runner.server
    if server is None:
        raise RuntimeError("the runner is not set up")
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: HeadDeadline(server(), head_timeout, guards, on_timeout, scrape_page),
        host,
        port,
        reuse_address=True,
    )
