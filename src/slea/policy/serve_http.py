"""The connection layer of ``slea serve``: what a socket may hold, apart from what a request may ask.

A server bounded by sockets is locked by clients that open connections and send nothing. Here requests are
bounded, and connections are bounded in time and number:

- a connection must send a whole request line and headers within ``header_timeout_s`` of its opening (and of its
  previous answer, on a kept-alive connection), else it is closed: bytes trickled in do not extend it;
- at most ``max_idle`` connections without a request in progress stay open: past that, the one idle longest is
  closed for the newcomer;
- at most ``max_in_flight`` requests are served at once (reading their body, waiting for the engine, generating,
  sending); one more is a 503. Idle connections do not count, and ``GET /health`` is neither counted nor refused.

:func:`protocol` is uvicorn's h11 protocol with the first two; :class:`Front` the ASGI entry with the third (and
the request log, the URL bound and the API key); :class:`Server` runs them under uvicorn.
"""

from __future__ import annotations

import asyncio
import hmac
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from slea.policy.openai_protocol import RequestError, error_body

MAX_URL_CHARS = 8192  # path + query of a request; longer: 414
# h11 refuses (uvicorn: 400) a request line and headers that exceed this before they are complete. Its default
# (16 KiB) made the answer to a 60 KB URL depend on TCP timing: 414 when it arrived in one read, 400 when in
# several. Past MAX_URL_CHARS and up to this, a URL is always 414; memory is bounded by the open connections (at
# most max_idle idle ones, max_in_flight busy ones) x this.
MAX_HEADER_BYTES = 1 << 20
HEALTH = "/health"


@dataclass(frozen=True)
class ConnectionLimits:
    """What a connection may hold (module docstring)."""

    header_timeout_s: float = 10.0
    max_idle: int = 256
    max_in_flight: int = 64


def protocol(limits: ConnectionLimits) -> type:
    """uvicorn's h11 protocol with a header timeout and a cap on idle connections (module docstring)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11(H11Protocol):
        _timer = None
        idle_since = 0.0

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._watch()
            _evict_idle(self.connections, limits.max_idle)

        def handle_events(self) -> None:
            super().handle_events()
            self._watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._watch()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def idle(self) -> bool:
            """No request in progress: none yet, or the last one answered."""
            return (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing()

        def _watch(self) -> None:
            """Arm the header timer when the connection turns idle; disarm it when a request's headers are in."""
            if not self.idle():
                self._disarm()
            elif self._timer is None:
                self.idle_since = time.monotonic()
                self._timer = self.loop.call_later(limits.header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self) -> None:
            self._timer = None
            if self.idle():
                self.close_idle()

        def close_idle(self) -> None:
            self._disarm()
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:  # the client broke the protocol first: closed all the same
                pass
            self.transport.close()

    return GuardedH11


def _evict_idle(connections, max_idle: int) -> None:
    """Close the connections idle longest while more than ``max_idle`` are idle."""
    idle = [c for c in connections if getattr(c, "idle", None) is not None and c.idle()]
    if len(idle) > max_idle:
        for c in sorted(idle, key=lambda c: c.idle_since)[:len(idle) - max_idle]:
            c.close_idle()


class Front:
    """The ASGI entry: every request is logged (``log``), a URL past :data:`MAX_URL_CHARS` is a 414, a trailing
    ``/`` is dropped from a path; then ``/health`` goes straight through, a request past ``max_in_flight`` is a 503,
    and, with an API key, one without ``Authorization: Bearer <key>`` a 401; then ``app``."""

    def __init__(self, app, log: Callable[[str], None], key: bytes | None, max_in_flight: int):
        self.app, self.log, self.key, self.max_in_flight = app, log, key, max_in_flight
        self.state = app.state
        self.in_flight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        query = scope.get("query_string", b"").decode("latin-1")
        self.log(f"{scope['method']} {path}" + (f"?{query}" if query else ""))
        if len(path) + len(query) > MAX_URL_CHARS:
            return await _refuse(414, f"the URL has {len(path) + len(query)} characters, more than {MAX_URL_CHARS}",
                                 "uri_too_long", scope, receive, send)
        if len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
        if scope["path"] == HEALTH:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.max_in_flight:
            return await _refuse(503, f"the server is busy: {self.in_flight} requests are in progress "
                                      f"(--max-in-flight {self.max_in_flight}); retry later", "server_busy",
                                 scope, receive, send, {"Retry-After": "1"})
        if self.key is not None and not self._authorized(scope):
            return await _refuse(401, "Incorrect or missing API key: send Authorization: Bearer <key> (slea serve "
                                      "--api-key)", "invalid_api_key", scope, receive, send,
                                 {"WWW-Authenticate": "Bearer"})
        self.in_flight += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
        return False


async def read_body(request, limit: int, stall_s: float, within_s: float) -> bytes:
    """The request body, at most ``limit`` bytes (a 413 beyond, also for a chunked body that grows past it); a
    body that stalls ``stall_s`` seconds between two pieces, or is not whole ``within_s`` seconds after its headers,
    is a 408 (the connection is closed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the request body has {int(declared)} bytes, more than this server takes "
                                f"({limit}: --max-body-mb)", code="request_too_large")
    from starlette.requests import ClientDisconnect

    chunks, size, pieces, end = [], 0, aiter(request.stream()), time.monotonic() + within_s
    try:
        while (chunk := await asyncio.wait_for(anext(pieces, None), min(stall_s, end - time.monotonic()))) is not None:
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"the request body is larger than this server takes ({limit} bytes: "
                                        f"--max-body-mb)", code="request_too_large")
            chunks.append(chunk)
    except ClientDisconnect:  # gone before its body arrived: nobody to answer
        raise RequestError(400, "the client disconnected before sending its body") from None
    except TimeoutError:
        raise RequestError(408, f"the request body did not arrive in time: nothing for {stall_s:g}s "
                                f"(--header-timeout), or not whole after {within_s:g}s (--request-timeout)",
                           code="request_timeout") from None
    return b"".join(chunks)


async def _refuse(status: int, message: str, code: str, scope, receive, send, headers: dict | None = None):
    from fastapi.responses import JSONResponse

    return await JSONResponse(error_body(status, message, None, code), status_code=status, headers=headers)(
        scope, receive, send)


class Server:
    """``slea serve``'s HTTP server: uvicorn (h11, :func:`protocol`) on a socket bound at construction, so
    ``server_address`` names the port before it serves (``port=0``: a free one). ``serve_forever`` blocks (in any
    thread; signals are handled only in the main one); ``shutdown`` stops it from another thread and waits.
    ``on_stop`` runs when it stops (in-flight generations stop), ``on_close`` at ``server_close``."""

    def __init__(self, app, host: str, port: int, limits: ConnectionLimits, on_stop: Callable[[], None],
                 on_close: Callable[[], None]):
        import uvicorn

        self.app, self.on_stop, self.on_close = app, on_stop, on_close
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, port), family=family, backlog=128)
        self.server_address = self.socket.getsockname()[:2]
        config = uvicorn.Config(app, http=protocol(limits), lifespan="off", log_config=None, access_log=False,
                                timeout_keep_alive=5, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                                timeout_graceful_shutdown=5, server_header=False)
        self._server = uvicorn.Server(config)
        self._done = threading.Event()
        self._done.set()

    def serve_forever(self) -> None:
        self._done.clear()
        try:
            self._server.run(sockets=[self.socket])
        finally:
            self.on_stop()
            self._done.set()

    def shutdown(self) -> None:
        self.on_stop()
        self._server.should_exit = True
        self._done.wait(timeout=30)

    def server_close(self) -> None:
        self.socket.close()
        self.on_close()
