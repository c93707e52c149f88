r"""The gateway's scrape, answered where its bytes arrive: no request object, no task, no loop hop. Pure.

Theory of operation
-------------------
An inference gateway's endpoint picker polls every pod's traffic port for ``GET /metrics`` every
50 ms on a kept-alive connection, and with flow control on it treats figures older than 200 ms as
saturation (``sidecar.server.gateway``). Through aiohttp, a scrape's bytes are parsed in the
transport's ``data_received``, handed to the connection's handler task, which wakes in a *later*
event-loop iteration, behind every callback the proxy's traffic queued meanwhile (streamed chunks,
upstream reads). On a busy loop that hop, not the page, is what a scrape waits for.

So the connection guard (:class:`sidecar.server.connection.HeadDeadline`) may answer a scrape itself,
in the same callback that received its head, from the page in memory. It does so only where the
answer cannot differ from aiohttp's and no state of aiohttp's is involved:

* only on a connection aiohttp has not seen a byte of: scrape-only connections, which is how the
  EPP and Prometheus poll. The first byte that is not a scrape hands the connection, with every byte
  held so far, to aiohttp for good, so responses can never be reordered and aiohttp's keep-alive
  timer never runs for a connection it does not know;
* only a request line ``GET /metrics HTTP/1.1`` (or ``HTTP/1.0``; a query string is allowed) whose
  head is complete and well formed, with no body (no ``Transfer-Encoding``, ``Content-Length`` 0 or
  absent), no ``Expect`` and no ``Upgrade``. Anything else, or anything :func:`read_scrape` is unsure
  of, is passed to aiohttp, whose parser (llhttp) answers it as it always did;
* keep-alive as RFC 9112 section 9.3 has it: HTTP/1.1 keeps the connection unless ``Connection``
  lists ``close``; HTTP/1.0 closes it unless it lists ``keep-alive``.

The answer is the same page and ``Content-Type`` as the route on the proxy application
(``Proxy.metrics_page``), with ``Content-Length``, ``Date`` (RFC 9110 section 6.6.1) and
``Server: kv-sidecar``. The head deadline still applies: a scrape head that trickles in is held
(never passed on) and cut with 408 when the deadline passes, as any other head.
"""

from __future__ import annotations

import email.utils
import enum
from dataclasses import dataclass

PATH = b"/metrics"
MAX_HEAD_BYTES = 8192
"""A scrape head longer than this is not the gateway's: aiohttp, with its own limits, takes it."""
_REQUEST_PREFIX = b"GET " + PATH


class Undecided(enum.Enum):
    """What :func:`read_scrape` answers when it cannot say yet, or says no."""

    NEED_MORE = "need-more"  # the bytes so far may still be a scrape: hold them
    TO_AIOHTTP = "to-aiohttp"  # not a scrape this path answers: hand every byte to aiohttp


@dataclass(frozen=True, slots=True)
class Scrape:
    """A complete scrape head at the front of the buffer."""

    length: int  # bytes of the head, blank line included
    keep_alive: bool
    http10: bool = False  # an HTTP/1.0 request: keep-alive is said, not implied


def read_scrape(buffer: bytes) -> Scrape | Undecided:
    """Whether ``buffer`` starts with a scrape this path may answer (see the module docstring)."""
    if not _REQUEST_PREFIX.startswith(buffer[: len(_REQUEST_PREFIX)]):
        return Undecided.TO_AIOHTTP
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return Undecided.NEED_MORE if len(buffer) < MAX_HEAD_BYTES else Undecided.TO_AIOHTTP
    request_line, *fields = buffer[:end].split(b"\r\n")
    version = _scrape_version(request_line)
    connection = _connection_tokens(fields)
    if version is None or connection is None:
        return Undecided.TO_AIOHTTP
    if version == b"HTTP/1.1":
        return Scrape(end + 4, keep_alive=b"close" not in connection)
    return Scrape(end + 4, keep_alive=b"keep-alive" in connection, http10=True)


def _scrape_version(request_line: bytes) -> bytes | None:
    """The HTTP version of ``GET /metrics[?query] HTTP/1.x``, or ``None`` for any other request line."""
    parts = request_line.split(b" ")
    if len(parts) != 3 or parts[0] != b"GET" or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        return None
    target = parts[1]
    return parts[2] if target == PATH or target.startswith(PATH + b"?") else None


def _connection_tokens(fields: list[bytes]) -> set[bytes] | None:
    """The ``Connection`` header's tokens, or ``None`` when a field is one for aiohttp to judge."""
    tokens: set[bytes] = set()
    for field in fields:
        name, colon, value = field.partition(b":")
        if not colon or not name or name != name.strip() or b"\n" in field or b"\r" in field:
            return None  # obsolete folding, a bare LF, a name with spaces
        name, value = name.lower(), value.strip()
        if name in (b"transfer-encoding", b"expect", b"upgrade") or (
            name == b"content-length" and value != b"0"
        ):
            return None  # a body, or a protocol change: not a plain scrape
        if name == b"connection":
            tokens.update(token.strip().lower() for token in value.split(b","))
    return tokens


def scrape_response(body: bytes, content_type: str, *, keep_alive: bool, http10: bool, now: float) -> bytes:
    """The whole answer to a scrape: status line, headers and ``body``."""
    headers = [
        "HTTP/1.1 200 OK",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        f"Date: {email.utils.formatdate(now, usegmt=True)}",
        "Server: kv-sidecar",
    ]
    if not keep_alive:
        headers.append("Connection: close")
    elif http10:
        headers.append("Connection: keep-alive")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body
