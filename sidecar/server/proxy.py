"""The reverse proxy in front of vLLM's OpenAI API.

Every method and path is forwarded to the one configured upstream (never a client-chosen target):
headers minus hop-by-hop ones, the body, the status, and the response: a non-streaming answer of known
length (up to 4 MiB) read whole and sent in one write, anything else streamed chunk by chunk as it
arrives (``iter_any``: Server-Sent Events are flushed at once, the first chunk is never held back).
One shared keep-alive client session carries all upstream traffic. Generation routes
(:data:`GENERATION_PATHS`) pass through admission first; every other route is forwarded as is.

A failed upstream *connect* is retried once (nothing was sent), then answered 503
``engine-unavailable``; nothing is ever retried once bytes were sent. When the client goes away
(aiohttp cancels the handler), the upstream response is closed, which makes vLLM abort the request
and free its KV blocks. The admission ticket is released when the response to the client has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from structlog.typing import FilteringBoundLogger

from sidecar.admission.anthropic import MESSAGES_ROUTE
from sidecar.admission.body import RequestFacts, decode_json_body, request_facts
from sidecar.admission.controller import AdmissionController, Ticket
from sidecar.admission.conversation import EngineChat
from sidecar.admission.outcomes import AdmissionError, Lane, Outcome, Reason, RefusedError
from sidecar.admission.tokens import TokenCounter
from sidecar.errors import KvSidecarError
from sidecar.server.gateway import CONTENT_TYPE as GATEWAY_CONTENT_TYPE
from sidecar.server.gateway import GatewayPage
from sidecar.server.lifecycle import Lifecycle
from sidecar.server.media_probe import teach_media_tokens
from sidecar.server.metrics import ProxyMetrics
from sidecar.server.recount_probe import PromptRecounter
from sidecar.server.wire import AnswerLength, error_response, forward_headers, response_headers, tenant_of
from sidecar.settings import ClientLimits
from sidecar.units import MIB, parse_duration

GENERATION_PATHS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/chat/completions/batch", "/v1/responses", MESSAGES_ROUTE}
)
"""Routes whose requests occupy KV cache and go through admission."""

OFFLOAD_BODY_BYTES = 64 * 1024
"""Bodies at least this large are decoded and counted in a worker thread (the estimator: ~10 us per KB)."""
OFFLOAD_EXACT_BODY_BYTES = 4 * 1024
"""With the real tokenizer (about 1.3 us per token, see bench/token_estimate.py: 40 ms for 32K tokens), bodies
from this size on are counted in a worker thread, so the event loop never waits more than ~1 ms on one."""


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """Where to forward and what clients may send."""

    upstream: str
    limits: ClientLimits = field(default_factory=ClientLimits)
    chat: EngineChat = field(default_factory=EngineChat)  # vLLM's chat flags: how its prompts are rendered


class _BodyTooLargeError(Exception):
    pass


BUFFERED_MAX_BYTES = 4 * MIB
"""Answers up to this size with a Content-Length (and not an event stream) go back in one write."""


def _buffered(upstream: aiohttp.ClientResponse) -> bool:
    length = upstream.content_length
    return (
        length is not None and length <= BUFFERED_MAX_BYTES and upstream.content_type != "text/event-stream"
    )


class _Account:
    """Counts one generation request's outcome exactly once (other routes are not counted)."""

    def __init__(self, controller: AdmissionController, generation: bool, route: str) -> None:
        self._controller = controller
        self.done, self.route = not generation, route
        self.lane = Lane.SHORT

    def record(self, outcome: Outcome, reason: Reason) -> None:
        if not self.done:
            self.done = True
            self._controller.count(outcome, reason, self.lane)


class Proxy:
    """The proxy handler and its upstream session."""

    def __init__(  # noqa: PLR0917 - the proxy's collaborators, each passed explicitly
        self,
        settings: ProxySettings,
        controller: AdmissionController,
        counter: TokenCounter,
        metrics: ProxyMetrics,
        lifecycle: Lifecycle,
        log: FilteringBoundLogger,
        *,
        engine_retry_after: Callable[[], int],
        gateway_page: GatewayPage | None = None,
        recounter: PromptRecounter | None = None,
    ) -> None:
        self.settings, self.controller, self.counter = settings, controller, counter
        self.metrics, self.lifecycle, self.log = metrics, lifecycle, log
        self._engine_retry_after = engine_retry_after
        self._gateway_page, self.recounter = gateway_page, recounter
        self._base = settings.upstream.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self.open_requests = 0

    async def start(self) -> None:
        """Open the shared upstream session (idle connections dropped before the engine drops them)."""
        limits = self.settings.limits
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=limits.upstream_keepalive),
            timeout=aiohttp.ClientTimeout(
                total=None, connect=limits.connect_timeout, sock_read=limits.upstream_timeout
            ),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )

    async def close(self) -> None:
        """Close the upstream session."""
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        """The aiohttp application: one catch-all route."""
        application = web.Application(client_max_size=self.settings.limits.max_body_bytes)
        if self._gateway_page is not None:
            application.router.add_get("/metrics", self.metrics_page)
        application.router.add_route("*", "/{tail:.*}", self.handle)
        return application

    async def metrics_page(self, _: web.Request) -> web.Response:
        """``GET /metrics``: the engine's page and the gateway gauges, from memory (see ``gateway``)."""
        assert self._gateway_page is not None  # noqa: S101 - the route exists only with a page
        return web.Response(body=self._gateway_page.render(), headers={"Content-Type": GATEWAY_CONTENT_TYPE})

    def _precheck(self, request: web.Request) -> RefusedError | None:
        """Refusals decided from the request line and headers alone, before reading the body."""
        if self.lifecycle.draining:
            return RefusedError(
                Reason.DRAINING,
                "the sidecar is shutting down; retry on another replica",
                retry_after=self.controller.waits.retry_after(Reason.QUEUE_TIMEOUT, Lane.SHORT, 0),
            )
        header_bytes = sum(map(len, itertools.chain.from_iterable(request.raw_headers)))
        limit = self.settings.limits.max_header_bytes
        if header_bytes > limit:
            return RefusedError(
                Reason.HEADERS_TOO_LARGE,
                f"request headers take {header_bytes} bytes; at most {limit} are allowed",
            )
        if (length := request.content_length) is not None and length > self.settings.limits.max_body_bytes:
            return RefusedError(
                Reason.BODY_TOO_LARGE, f"the request body exceeds {self.settings.limits.max_body_bytes} bytes"
            )
        return None

    async def _read_body(self, request: web.Request) -> bytes:
        if not request.body_exists:
            return b""
        content = request.content
        if content.is_eof():  # the whole body came with the head: no clock, no iteration (the common case)
            whole = content.read_nowait(-1)
            if len(whole) > self.settings.limits.max_body_bytes:
                raise _BodyTooLargeError
            return whole
        chunks: list[bytes] = []
        size = 0
        async with asyncio.timeout(self.settings.limits.body_timeout):
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > self.settings.limits.max_body_bytes:
                    raise _BodyTooLargeError
                chunks.append(chunk)
        return b"".join(chunks)

    def _wait_limit(self, request: web.Request) -> float | None:
        if raw := request.headers.get(self.settings.limits.queue_timeout_header):
            with contextlib.suppress(KvSidecarError):  # an unreadable header keeps the configured limit
                return max(0.0, parse_duration(raw))
        return None

    def _header_priority(self, request: web.Request) -> int | RefusedError | None:
        """The priority header's value, the refusal it earns if it is no integer, or ``None`` without one."""
        raw = request.headers.get(self.settings.limits.priority_header)
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            return RefusedError(
                Reason.INVALID_REQUEST, f"header {self.settings.limits.priority_header} must be an integer"
            )

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Admit (for generation routes) and forward one request; count how it ended exactly once."""
        started = time.perf_counter()
        generation = request.method == "POST" and request.path in GENERATION_PATHS
        account = _Account(self.controller, generation, request.path)
        self.open_requests += 1
        ticket: Ticket | None = None
        try:
            refusal = self._precheck(request)
            if refusal is not None:
                account.record(Outcome.REFUSED, refusal.reason)
                return error_response(refusal, request.path)
            try:
                body = await self._read_body(request)
            except _BodyTooLargeError:
                size = self.settings.limits.max_body_bytes
                return self._refuse(account, Reason.BODY_TOO_LARGE, f"the request body exceeds {size} bytes")
            except TimeoutError:
                wait = self.settings.limits.body_timeout
                return self._refuse(
                    account, Reason.BODY_TIMEOUT, f"the request body did not arrive within {wait:g}s"
                )
            lane_label = "other"
            if generation:
                try:
                    facts = await self._facts(request, body)
                except RefusedError as error:
                    account.record(Outcome.REFUSED, error.reason)
                    return error_response(error, request.path)
                account.lane = self.controller.lane_of(facts)  # a request cancelled while queued counts here
                media = self.controller.planner.media
                await teach_media_tokens(self._session, self._base, request, body, facts=facts, media=media)
                try:
                    ticket = await self.controller.admit(facts)
                except AdmissionError as error:
                    account.done = True  # the controller counted its own refusal or drop
                    self.log.info(
                        "refused", reason=error.reason.value, path=request.path, retry_after=error.retry_after
                    )
                    return error_response(error, request.path)
                account.lane = ticket.lane
                lane_label = ticket.lane  # a StrEnum: its own label value
            return await self._forward(request, body, ticket, account, lane=lane_label, started=started)
        except asyncio.CancelledError:
            account.record(Outcome.CANCELLED, Reason.CLIENT_DISCONNECTED)  # the client went away first
            raise
        finally:
            self.open_requests -= 1
            if ticket is not None:
                self.controller.release(ticket)

    async def _facts(self, request: web.Request, body: bytes) -> RequestFacts:
        """Admission's facts from body (in a thread if large) and headers; vLLM recounts too-long prompts."""
        path, header_priority = request.path, self._header_priority(request)
        tenant, limit = tenant_of(request, self.settings.limits.tenant_header), self._wait_limit(request)
        priority = header_priority if isinstance(header_priority, int) else None

        def facts_of() -> RequestFacts:
            decoded = decode_json_body(body)
            return request_facts(
                path, decoded, self.counter, tenant=tenant, priority=priority, wait_limit=limit,
                effort_map=self.settings.chat.reasoning_effort_map,
            )  # fmt: skip

        threshold = OFFLOAD_EXACT_BODY_BYTES if self.counter.exact else OFFLOAD_BODY_BYTES
        facts = facts_of() if len(body) < threshold else await asyncio.to_thread(facts_of)
        if isinstance(header_priority, RefusedError):  # after the body's own refusals, as before
            raise header_priority
        if self.recounter is None:
            return facts
        exact, session = self.counter.chats_exact, self._session
        return await self.recounter.recount(session, self._base, request, body, facts, chats_exact=exact)

    async def _forward_whole(
        self, request: web.Request, upstream: aiohttp.ClientResponse, ticket: Ticket | None, *, lane: str,
        started: float,
    ) -> web.Response:  # fmt: skip
        """A non-streaming answer of known length: read whole, sent in one write (the cheapest path)."""
        try:
            data = await upstream.read()
        except (aiohttp.ClientError, TimeoutError) as exc:  # nothing was sent to the client yet: a clean 502
            upstream.close()  # vLLM aborts the request
            self.log.warning("upstream_broke_off", error=f"{type(exc).__name__}: {exc}", path=request.path)
            broke = RefusedError(Reason.ENGINE_ERROR, "the engine broke off its answer")
            return error_response(broke, request.path)
        finally:
            self.metrics.ttfb_of(lane).observe(time.perf_counter() - started)
        upstream.release()
        if ticket is not None and upstream.status == 200:
            answer = AnswerLength(ticket)
            answer.feed(data)
            ticket.completion_tokens, ticket.prompt_usage = answer.completion_tokens(), answer.prompt_tokens()
        headers = response_headers(upstream.headers, whole=True)  # web.Response sets the length from the body
        self.metrics.duration_of(lane).observe(time.perf_counter() - started)
        return web.Response(status=upstream.status, reason=upstream.reason, body=data, headers=headers)

    def _refuse(self, account: _Account, reason: Reason, message: str) -> web.Response:
        account.record(Outcome.REFUSED, reason)
        return error_response(RefusedError(reason, message), account.route)

    async def _connect(self, request: web.Request, body: bytes) -> aiohttp.ClientResponse | RefusedError:
        """The upstream's response (headers received), or the refusal to answer with instead."""
        assert self._session is not None  # noqa: S101 - start() runs before serving
        headers = forward_headers(request.headers, request.remote)
        url = self._base + str(request.rel_url)
        for attempt in (1, 2):
            try:
                return await self._session.request(
                    request.method, url, headers=headers, data=body or None, allow_redirects=False
                )
            except aiohttp.ClientConnectorError as exc:  # nothing was sent: safe to retry once
                if attempt == 2:
                    self.log.warning("upstream_unavailable", error=f"{type(exc).__name__}: {exc}")
            except TimeoutError:  # bytes were sent: never retried
                self.log.warning(
                    "upstream_timeout", path=request.path, timeout=self.settings.limits.upstream_timeout
                )
                return RefusedError(
                    Reason.ENGINE_TIMEOUT,
                    f"the engine did not answer within {self.settings.limits.upstream_timeout:g}s",
                )
            except aiohttp.ClientError as exc:
                self.log.warning("upstream_failed", error=f"{type(exc).__name__}: {exc}", path=request.path)
                return RefusedError(Reason.ENGINE_ERROR, "the engine closed the connection without an answer")
        return RefusedError(
            Reason.ENGINE_UNAVAILABLE, "the engine is not reachable", retry_after=self._engine_retry_after()
        )

    async def _forward(
        self,
        request: web.Request,
        body: bytes,
        ticket: Ticket | None,
        account: _Account,
        *,
        lane: str,
        started: float,
    ) -> web.StreamResponse:
        upstream = await self._connect(request, body)
        if isinstance(upstream, RefusedError):
            # engine-unavailable: never sent; engine-error/-timeout: sent, but no answer came
            outcome = Outcome.REFUSED if upstream.reason is Reason.ENGINE_UNAVAILABLE else Outcome.ADMITTED
            account.record(outcome, upstream.reason)
            return error_response(upstream, request.path)
        if ticket is not None:
            account.record(Outcome.ADMITTED, Reason.QUEUED if ticket.queued else Reason.ADMITTED)
        if _buffered(upstream):
            return await self._forward_whole(request, upstream, ticket, lane=lane, started=started)
        return await self._forward_stream(request, upstream, ticket, lane=lane, started=started)

    async def _forward_stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, ticket: Ticket | None, *, lane: str,
        started: float,
    ) -> web.StreamResponse:  # fmt: skip
        """Anything else: streamed chunk by chunk as it arrives, the first chunk never held back."""
        complete = False
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            response.headers.extend(response_headers(upstream.headers))
            await response.prepare(request)
            first = True
            answer = AnswerLength(ticket) if ticket is not None and upstream.status == 200 else None
            try:
                async for chunk in upstream.content.iter_any():
                    if first:
                        self.metrics.ttfb_of(lane).observe(time.perf_counter() - started)
                        first = False
                    await response.write(chunk)
                    if answer is not None and (generated := answer.feed(chunk)) is not None:
                        self.controller.progress(answer.ticket, generated)
            except (
                aiohttp.ClientError,
                TimeoutError,
            ) as exc:  # the engine broke off mid-response: so must we
                self.log.warning(
                    "upstream_broke_off", error=f"{type(exc).__name__}: {exc}", path=request.path
                )
                if request.transport is not None:
                    request.transport.close()
                return response
            await response.write_eof()
            complete = True
            if answer is not None:
                answer.ticket.completion_tokens = answer.completion_tokens()
                answer.ticket.counted = not answer.usage_seen
                answer.ticket.prompt_usage = answer.prompt_tokens()
            return response
        finally:
            if complete:
                upstream.release()
            else:
                upstream.close()  # closing the connection makes vLLM abort the request
            self.metrics.duration_of(lane).observe(time.perf_counter() - started)
