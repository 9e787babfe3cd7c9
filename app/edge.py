"""The HTTP edge: what happens to a request before the API sees it, and to a connection before
it carries a request.

- ``EdgeMiddleware`` (pure ASGI, the first code of the app a request meets, after
  app.metrics' timer): a request id on every response and on the request's log lines, the
  API-key check before any body is read (the admin key for /admin and /metrics), the body size
  limit before the body is parsed, and a JSON 500 for any unexpected exception that keeps the
  connection usable.
- ``EdgeHttpToolsProtocol`` / ``EdgeH11Protocol`` (uvicorn's HTTP protocols, as run by
  ``memory-service serve``): a connection must send a complete request head within
  MEMORY_HEADER_TIMEOUT_SECONDS and in at most ``MAX_HEAD_BYTES``; uvicorn bounds neither
  (httptools accepts a head of any size, and no timer runs while a head arrives).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import traceback
import uuid
from collections.abc import Iterable
from typing import Any, cast

import h11
import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from app import logs
from app.api.docs import DOCS_PATHS
from app.metrics import METRICS_PATH
from app.settings import Settings

logger = logging.getLogger("app.edge")

DEFAULT_TENANT = "default"
# Keys of the ASGI scope's "state" (request.state.tenant, request.state.request_id,
# request.state.admin: the admin key was presented).
TENANT = "tenant"
REQUEST_ID = "request_id"
ADMIN = "admin"
ADMIN_PREFIX = "/admin/"
# Who the admin key authenticates, among the tenants of api_key_digests (no tenant name has '*').
_ADMIN_IDENTITY = "*admin*"

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# A conversation's export document may be larger than any other body: its own bound.
IMPORT_PATH = "/conversations/import"
# A request line plus headers; more is a 431 (httptools) or 400 (h11). h11's default, and Node's.
MAX_HEAD_BYTES = 16 * 1024
MAX_REQUEST_ID_CHARS = 128


# ---- API keys --------------------------------------------------------------------------------


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def api_key_digests(settings: Settings) -> dict[bytes, str]:
    """Keys are held only as SHA-256 digests once parsed."""
    return {_digest(key): tenant for key, tenant in settings.api_keys.items()}


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def authenticate(headers: Iterable[tuple[bytes, bytes]], keys: dict[bytes, str]) -> tuple[str | None, str]:
    """The tenant of the key presented in ``X-API-Key`` or ``Authorization: Bearer``, or None
    and why not."""
    headers = list(headers)
    presented = _header(headers, b"x-api-key")
    authorization = _header(headers, b"authorization")
    if presented is None and authorization is not None:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer":
            presented = token.strip()
    if not presented:
        return None, "missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'"
    digest = _digest(presented)
    tenant = None
    # Compare against every key in constant time, so timing reveals neither key nor position.
    for candidate, owner in keys.items():
        if hmac.compare_digest(candidate, digest):
            tenant = owner
    return tenant, "invalid API key"


# ---- Operators: the admin key and /metrics -------------------------------------------------------


def metrics_public(settings: Settings) -> bool:
    """/metrics without a key: MEMORY_METRICS_PUBLIC, by default only when no key of any kind is
    set. Otherwise it needs the admin key (tenant keys see no other tenant, and the metrics are
    the whole service's)."""
    if settings.MEMORY_METRICS_PUBLIC is None:
        return not settings.api_keys and settings.admin_key is None
    return settings.MEMORY_METRICS_PUBLIC


# ---- Docs --------------------------------------------------------------------------------------


def docs_public(settings: Settings) -> bool:
    """/docs, /redoc and /openapi.json without a key: MEMORY_DOCS_PUBLIC, by default only when
    there are no keys."""
    if settings.MEMORY_DOCS_PUBLIC is None:
        return not settings.api_keys
    return settings.MEMORY_DOCS_PUBLIC


def docs_served(settings: Settings) -> bool:
    """With keys the docs are served to key holders at least; without keys,
    MEMORY_DOCS_PUBLIC=false turns them off (404)."""
    return bool(settings.api_keys) or docs_public(settings)


# ---- Request ids -------------------------------------------------------------------------------


def _request_id(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The caller's X-Request-ID when it is sane (1-128 printable ASCII characters), else a new one."""
    given = _header(headers, b"x-request-id")
    if given and len(given) <= MAX_REQUEST_ID_CHARS and given.isascii() and given.isprintable():
        return given
    return uuid.uuid4().hex


def request_id_of(scope: Scope) -> str | None:
    state = scope.get("state")
    return state.get(REQUEST_ID) if isinstance(state, dict) else None


# ---- The middleware ----------------------------------------------------------------------------


class BodyTooLarge(HTTPException):
    """Raised by ``receive`` once a body passes the limit: the app's HTTPException handler answers
    it with a JSON 413 (and the middleware does, if the app lets it through)."""

    def __init__(self, limit: int, setting: str = "MEMORY_MAX_BODY_BYTES") -> None:
        super().__init__(status_code=413, detail=body_too_large_detail(limit, setting))


class BodyTimedOut(HTTPException):
    """Raised by ``receive`` when the next piece of a body does not come in time: a JSON 408."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            status_code=408,
            detail=f"request body stalled for {seconds:g}s (MEMORY_HEADER_TIMEOUT_SECONDS)",
        )


def body_too_large_detail(limit: int, setting: str = "MEMORY_MAX_BODY_BYTES") -> str:
    return f"request body larger than {limit} bytes ({setting})"


async def _send_json(
    send: Send, status: int, payload: dict[str, Any], headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    body = orjson.dumps(payload)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def describe_exception(exc: BaseException) -> str:
    """The traceback of ``exc`` and of the exceptions that led to it, with their types but not
    their messages, at every log level: messages may quote request data (a database error its
    failing row, a ResponseValidationError the response), and message content is never logged."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    parts = []
    for error in reversed(chain):
        name = f"{type(error).__module__}.{type(error).__qualname__}"
        parts.append(
            "Traceback (most recent call last):\n" + "".join(traceback.format_tb(error.__traceback__)) + name
        )
    return "\n\nwhich led to:\n\n".join(parts)


def _loggable(path: str) -> str:
    """A path as a log line may show it (a decoded %0A must not start a forged line)."""
    return path if path.isprintable() else ascii(path)


def internal_error_payload(request_id: str | None) -> dict[str, Any]:
    return {"detail": "internal error", "code": "internal_error", "request_id": request_id}


class EdgeMiddleware:
    """Pure ASGI, so that nothing reads the body before it has decided about the request:
    a 401 for a missing or wrong key and a 413 for a declared Content-Length over the limit are
    sent without reading a byte of the body; a chunked body is counted as the app reads it and
    cut off at the limit."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.max_body = settings.MEMORY_MAX_BODY_BYTES
        self.max_import = settings.MEMORY_MAX_IMPORT_BYTES
        self.body_timeout = settings.MEMORY_HEADER_TIMEOUT_SECONDS
        self.keys = api_key_digests(settings)
        self.open_paths = OPEN_PATHS | DOCS_PATHS if docs_public(settings) else OPEN_PATHS
        # The admin key among the tenants' keys: every key is compared whichever is presented.
        admin = settings.admin_key
        self.operator_keys = {**self.keys, **({_digest(admin): _ADMIN_IDENTITY} if admin else {})}
        self.admin_routes = admin is not None
        self.metrics_public = metrics_public(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        request_id = _request_id(headers)
        state: dict[str, Any] = scope.setdefault("state", {})
        state[REQUEST_ID] = request_id
        # On this request's log lines; app.metrics.MetricsMiddleware unbinds it when it ends.
        logs.bind(request_id=request_id)
        id_header = (b"x-request-id", request_id.encode())
        started = complete = False

        async def send_with_id(message: Message) -> None:
            nonlocal started, complete
            if message["type"] == "http.response.start":
                started = True
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*kept, id_header]}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        # The protocols bound a head that arrives in pieces; one that arrives whole is measured
        # here (as any server would see it: request line and header lines).
        head = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 16
        head += sum(len(name) + len(value) + 4 for name, value in headers)
        if head > MAX_HEAD_BYTES:
            detail = f"request head larger than {MAX_HEAD_BYTES} bytes"
            await _send_json(send_with_id, 431, {"detail": detail, "code": "header_too_large"})
            return

        path = scope["path"]
        if path == METRICS_PATH and self.metrics_public:
            pass
        elif path == METRICS_PATH or (self.admin_routes and path.startswith(ADMIN_PREFIX)):
            who, problem = authenticate(headers, self.operator_keys)
            if who is None:
                await _send_json(
                    send_with_id,
                    401,
                    {"detail": problem, "code": "unauthorized"},
                    [(b"www-authenticate", b"Bearer")],
                )
                return
            if who != _ADMIN_IDENTITY:  # a tenant's key
                detail = "this endpoint needs the admin key (MEMORY_ADMIN_KEY)"
                await _send_json(send_with_id, 403, {"detail": detail, "code": "forbidden"})
                return
            state[ADMIN] = True
        elif not self.keys:
            state[TENANT] = DEFAULT_TENANT
        elif path not in self.open_paths:
            tenant, problem = authenticate(headers, self.keys)
            if tenant is None:
                await _send_json(
                    send_with_id,
                    401,
                    {"detail": problem, "code": "unauthorized"},
                    [(b"www-authenticate", b"Bearer")],
                )
                return
            state[TENANT] = tenant

        if path == IMPORT_PATH and scope.get("method") == "POST":
            max_body, setting = self.max_import, "MEMORY_MAX_IMPORT_BYTES"
        else:
            max_body, setting = self.max_body, "MEMORY_MAX_BODY_BYTES"
        declared = _header(headers, b"content-length") or ""
        if declared.isascii() and declared.isdigit() and int(declared) > max_body:
            detail = body_too_large_detail(max_body, setting)
            await _send_json(send_with_id, 413, {"detail": detail, "code": "payload_too_large"})
            return

        received = 0
        body_complete = False

        async def receive_within_limit() -> Message:
            nonlocal received, body_complete
            if received > max_body:
                raise BodyTooLarge(max_body, setting)
            if body_complete:
                # Past the body, receive() only waits for the client to go (a streaming response
                # listens for it for as long as it streams): no deadline.
                return await receive()
            try:
                # A body that trickles in holds a connection and a worker: each piece must come
                # within the head's deadline.
                async with asyncio.timeout(self.body_timeout):
                    message = await receive()
            except TimeoutError:
                raise BodyTimedOut(self.body_timeout) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_body:
                    raise BodyTooLarge(max_body, setting)
                body_complete = not message.get("more_body", False)
            return message

        try:
            await self.app(scope, receive_within_limit, send_with_id)
        except (BodyTooLarge, BodyTimedOut) as exc:
            if not started:
                code = "payload_too_large" if exc.status_code == 413 else "request_timeout"
                await _send_json(send_with_id, exc.status_code, {"detail": exc.detail, "code": code})
            elif not complete:
                raise
        except Exception as exc:
            if started and not complete:
                raise  # half a response is out: nothing to do but drop the connection
            logger.error(
                "Unexpected error in %s %s (request_id=%s)%s\n%s",
                scope.get("method"),
                _loggable(scope.get("path", "")),
                request_id,
                " after the response was sent" if complete else "",
                describe_exception(exc),
            )
            if not started:
                await _send_json(send_with_id, 500, internal_error_payload(request_id))


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Last resort, for an error EdgeMiddleware did not catch (one of its own): still a JSON 500."""
    request_id = request_id_of(request.scope)
    logger.error(
        "Unexpected error in %s %s (request_id=%s)\n%s",
        request.method,
        _loggable(request.url.path),
        request_id,
        describe_exception(exc),
    )
    return JSONResponse(
        status_code=500,
        content=internal_error_payload(request_id),
        headers={"X-Request-ID": request_id} if request_id else None,
    )


# ---- uvicorn's HTTP protocols with a deadline and a size limit for the request head ------------

# After an error answer to a request whose head never completed, how long the connection keeps
# reading (and dropping) what the client still sends, so that closing it does not reset it
# before the client has read the answer.
LINGER_SECONDS = 1.0
_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _HeadLimits:
    """What both protocols add to uvicorn's: a connection has ``header_timeout`` seconds from
    its opening (or, between requests, from the first byte of the next one) to send a complete
    request head, of at most ``max_head_bytes``. An idle keep-alive connection stays under
    uvicorn's keep-alive timeout; a request whose head is complete is not limited here (its body
    and its handling take as long as they take). Mixed in before uvicorn's class."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop

    def _init_head_limits(self, header_timeout: float, max_head_bytes: int) -> None:
        self.header_timeout = header_timeout
        self.max_head_bytes = max_head_bytes
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # received since the current head began
        self._rejected = False  # answered with an error: dropping input until closed
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]  # uvicorn's, after this mixin
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)  # type: ignore[misc]

    def _response_on_its_way(self) -> bool:
        raise NotImplementedError

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn's warning tells to install a WebSocket library; `serve` runs without one on
        purpose (no route is a WebSocket), and the request is served as plain HTTP."""
        logger.debug("Upgrade header ignored: no WebSocket endpoints; served as HTTP")

    def _close_after_response(self) -> None:
        raise NotImplementedError

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_head_timer()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self._rejected:
            return
        if self._response_on_its_way():
            # The next (pipelined) head stalls while a response is being written: finish the
            # response, then close.
            self._close_after_response()
        elif self._head_bytes:
            detail = (
                f"request head not received within {self.header_timeout:g}s (MEMORY_HEADER_TIMEOUT_SECONDS)"
            )
            self._reject(408, {"detail": detail, "code": "request_timeout"})
        else:
            self.transport.close()

    def _head_too_large(self) -> None:
        detail = f"request head larger than {self.max_head_bytes} bytes"
        self._reject(431, {"detail": detail, "code": "header_too_large"})

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what its parser refuses (h11 refuses a head over its size)."""
        if self._head_bytes > self.max_head_bytes:
            self._head_too_large()
        else:
            self._reject(400, {"detail": "invalid HTTP request", "code": "bad_request"})

    def _reject(self, status: int, payload: dict[str, Any]) -> None:
        """Answer, then close: at once if the transport cannot half-close, else after the
        client has closed its side or LINGER_SECONDS have passed, whichever comes first."""
        self._rejected = True
        self._cancel_head_timer()
        body = orjson.dumps(payload)
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, _REASONS[status], len(body), body)
        )
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger = self.loop.call_later(LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()


class EdgeHttpToolsProtocol(_HeadLimits, HttpToolsProtocol):
    """uvicorn's httptools protocol with the head's deadline and size limit (httptools itself
    accepts a head of any size)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        header_timeout: float,
        max_head_bytes: int = MAX_HEAD_BYTES,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._init_head_limits(header_timeout, max_head_bytes)
        self._awaiting_head = True  # the parser is between messages or inside a head

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._awaiting_head:
            self._arm_head_timer()
            self._head_bytes += len(data)
        super().data_received(data)
        if self._awaiting_head and self._head_bytes > self.max_head_bytes and not self._rejected:
            self._head_too_large()

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_head = True

    def _response_on_its_way(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _close_after_response(self) -> None:
        self.cycle.keep_alive = False
        self.flow.pause_reading()


class EdgeH11Protocol(_HeadLimits, H11Protocol):
    """uvicorn's h11 protocol with the head's deadline; h11 bounds the head's size itself (its
    max_incomplete_event_size, which uvicorn's ``h11_max_incomplete_event_size`` sets too)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        header_timeout: float,
        max_head_bytes: int = MAX_HEAD_BYTES,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self._init_head_limits(header_timeout, max_head_bytes)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self.conn.their_state is h11.IDLE:
            self._arm_head_timer()
            self._head_bytes += len(data)
        super().data_received(data)
        self._check_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may parse a pipelined request
        self._check_head()

    def _check_head(self) -> None:
        if self.conn.their_state not in (h11.IDLE, h11.ERROR):  # a request head arrived
            self._cancel_head_timer()
            self._head_bytes = 0

    def _response_on_its_way(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _close_after_response(self) -> None:
        self.cycle.keep_alive = False
        self.flow.pause_reading()

    def _reject(self, status: int, payload: dict[str, Any]) -> None:
        # Written past h11's state machine (it has no request to answer): tell it the end.
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.send(h11.ConnectionClosed())
        super()._reject(status, payload)


def http_protocol(kind: str, settings: Settings) -> type[asyncio.Protocol]:
    """The protocol to pass as uvicorn's ``http=`` (``kind``: auto, httptools or h11; auto is
    httptools, which uvicorn[standard] installs): a picklable partial (``--workers`` ships the
    config to its processes) that uvicorn calls as it would a protocol class."""
    cls: type[EdgeHttpToolsProtocol | EdgeH11Protocol] = (
        EdgeH11Protocol if kind == "h11" else EdgeHttpToolsProtocol
    )
    factory = functools.partial(
        cls, header_timeout=settings.MEMORY_HEADER_TIMEOUT_SECONDS, max_head_bytes=MAX_HEAD_BYTES
    )
    return cast(type[asyncio.Protocol], factory)
