"""The scrape path's reading of a request head, at its boundaries (pure: bytes in, decision out)."""

from __future__ import annotations

import pytest

from sidecar.server.scrape_path import MAX_HEAD_BYTES, Scrape, Undecided, read_scrape, scrape_response

NEED_MORE, TO_AIOHTTP = Undecided.NEED_MORE, Undecided.TO_AIOHTTP
HEAD = b"GET /metrics HTTP/1.1\r\nHost: pod:8000\r\nAccept: text/plain\r\n\r\n"


@pytest.mark.parametrize(
    ("buffer", "expected"),
    [
        (HEAD, Scrape(len(HEAD), keep_alive=True)),
        (HEAD + b"GET /metrics", Scrape(len(HEAD), keep_alive=True)),  # a pipelined next one is left
        (b"GET /metrics?x=1 HTTP/1.1\r\n\r\n", Scrape(29, keep_alive=True)),
        (b"GET /metrics HTTP/1.1\r\nConnection: Close\r\n\r\n", Scrape(44, keep_alive=False)),
        (b"GET /metrics HTTP/1.1\r\nConnection: TE, close\r\n\r\n", Scrape(48, keep_alive=False)),
        (b"GET /metrics HTTP/1.0\r\n\r\n", Scrape(25, keep_alive=False, http10=True)),
        (
            b"GET /metrics HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            Scrape(49, keep_alive=True, http10=True),
        ),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", Scrape(44, keep_alive=True)),
        (b"G", NEED_MORE),  # a prefix of the request line: wait
        (b"GET /metr", NEED_MORE),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", NEED_MORE),  # the head has not ended
        (b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEAD_BYTES // 6), TO_AIOHTTP),  # too long
        (b"POST /v1/completions HTTP/1.1\r\n\r\n", TO_AIOHTTP),
        (b"GET /v1/models HTTP/1.1\r\n\r\n", TO_AIOHTTP),
        (b"HEAD /metrics HTTP/1.1\r\n\r\n", TO_AIOHTTP),
        (b"GET /metricsx HTTP/1.1\r\n\r\n", TO_AIOHTTP),
        (b"GET /metrics/ HTTP/1.1\r\n\r\n", TO_AIOHTTP),
        (b"GET /metrics HTTP/2.0\r\n\r\n", TO_AIOHTTP),
        (b"GET  /metrics HTTP/1.1\r\n\r\n", TO_AIOHTTP),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", TO_AIOHTTP),  # a body
        (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", TO_AIOHTTP),
        (b"GET /metrics HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", TO_AIOHTTP),
        (b"GET /metrics HTTP/1.1\r\nUpgrade: h2c\r\n\r\n", TO_AIOHTTP),
        (b"GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n", TO_AIOHTTP),  # a space before the colon
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", TO_AIOHTTP),  # obsolete line folding
        (b"GET /metrics HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", TO_AIOHTTP),  # a bare LF
        (b"GET /metrics HTTP/1.1\r\nnocolon\r\n\r\n", TO_AIOHTTP),
    ],
)
def test_read_scrape(buffer: bytes, expected: Scrape | Undecided) -> None:
    assert read_scrape(buffer) == expected


def test_the_answer_says_its_length_date_and_connection() -> None:
    answer = scrape_response(b"abc\n", "text/plain; version=0.0.4", keep_alive=True, http10=False, now=0.0)
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.split(b"\r\n") == [
        b"HTTP/1.1 200 OK",
        b"Content-Type: text/plain; version=0.0.4",
        b"Content-Length: 4",
        b"Date: Thu, 01 Jan 1970 00:00:00 GMT",
        b"Server: kv-sidecar",
    ]
    assert body == b"abc\n"
    closing = scrape_response(b"", "t", keep_alive=False, http10=False, now=0.0)
    assert b"\r\nConnection: close\r\n" in closing
    assert b"\r\nConnection: keep-alive\r\n" in scrape_response(
        b"", "t", keep_alive=True, http10=True, now=0.0
    )
