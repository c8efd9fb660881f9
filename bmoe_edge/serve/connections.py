"""Connections: no socket can hold the server. uvicorn's h11 protocol with a deadline on every request
head, a cap on open connections per client address and in all (a new connection evicts the one that has
waited longest for its next request rather than being refused), and an in-flight request limit of our
own that `/health` is exempt from (uvicorn's `limit_concurrency` counted idle sockets and /health alike).

The uvicorn internals this relies on (`check_uvicorn` verifies them at start, tests/test_serve_connections.py
in the suite; both fail loudly if an upgrade changes them):
- `H11Protocol(config=, server_state=, app_state=, _loop=)` is how uvicorn makes a connection's protocol;
- `self.connections` is the server's shared set of open protocols (added in connection_made, discarded in
  connection_lost); `self.client` the peer's (host, port) once connected; `self.transport`, `self.loop`;
- `self.conn` is the connection's h11.Connection; `self.cycle` its current RequestResponseCycle (None
  before the first request head), whose `response_complete` turns true when the response is sent;
- `on_response_complete()` runs when a response is sent and the connection may wait for its next request;
- `data_received(data)` is where the bytes of a connection enter; `send_400_response(msg)` is uvicorn's own 400
  for bytes h11 refuses; a cycle whose `disconnected` is true sends nothing.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from bmoe_edge.errors import BmoeError
from bmoe_edge.serve.api_errors import ApiError
from bmoe_edge.serve.app import RETRY_AFTER_S

HEAD_TIMEOUT_S = 10.0   # a request line and its headers arrive within this, or the connection is closed (408)
HEAD_TIMEOUT_ENV = "BMOE_EDGE_SERVE_HEAD_TIMEOUT"   # seconds; read once per server start (the tests use 1)
KEEP_ALIVE_S = 5.0      # an idle keep-alive connection closes after this (uvicorn's timer), silently
HEALTH_PATH = "/health"  # never counted as a request in flight: a load balancer reads it when all are busy
MIN_CONNECTIONS = 3     # the fewest for which fewer requests may be in flight than one address holds connections


@dataclass(frozen=True)
class Limits:
    connections: int      # open connections in all (serve's --max-connections)
    per_address: int      # open connections from one client address (an IPv6 /64 counts as one)
    requests: int         # requests in flight but GET /health; more are answered 503 at once
    head_timeout_s: float

    @property
    def keep_alive_s(self) -> float:
        # never longer than a head may take: an idle connection closes silently before it would get a 408
        return min(KEEP_ALIVE_S, self.head_timeout_s)

    @classmethod
    def for_max_connections(cls, connections: int) -> Limits:
        """The one knob, --max-connections; the rest derived so that a slot is always free for /health: a
        connection is busy only while a request is in flight, and fewer requests may be in flight than one
        address may hold connections, so every new connection finds an idle one of its own address (or,
        when the total is reached, of anyone's) to take the place of."""
        if connections < MIN_CONNECTIONS:
            raise BmoeError(f"--max-connections takes at least {MIN_CONNECTIONS} (one for /health beside a request "
                            f"in flight and the connection it replaces), got {connections}")
        return cls(connections=connections, per_address=connections * 3 // 4, requests=connections // 2,
                   head_timeout_s=head_timeout_s())


def head_timeout_s() -> float:
    raw = os.environ.get(HEAD_TIMEOUT_ENV)
    if raw is None:
        return HEAD_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise BmoeError(f"${HEAD_TIMEOUT_ENV} takes seconds (more than 0, at most 3600), got {raw!r}")
    return value


def client_key(client: tuple[str, int] | None) -> str:
    """Which address a connection counts against: an IPv4 address (an IPv4-mapped IPv6 one too), or an IPv6
    /64 (one subscriber's prefix: its 2^64 addresses are one client)."""
    if client is None:
        return ""
    try:
        address = ipaddress.ip_address(client[0].split("%", 1)[0])
    except ValueError:
        return client[0]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/64", strict=False))
    return str(address)


def _raw_error(status: int, reason: str, error: ApiError) -> bytes:
    """A whole response written straight to the socket (no request was parsed to answer), then closed."""
    body = json.dumps(error.body()).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the limits above; `protocol_for(limits)` binds them."""

    limits: Limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting_since = time.monotonic()   # since when it waits for its next request head
        self._head_clock: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._wait_for_head()
        self._admit()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_clock()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        # Bytes h11 refuses after a request head (a body that is not what its head claims, e.g. a chunked claim
        # over plain bytes) make uvicorn answer 400 and end the connection while the request's app may still be
        # about to answer: its answer is then sent nowhere (the cycle counts as disconnected), instead of
        # failing in h11 (MUST_CLOSE) with a traceback in the log — seen in the HTTP fuzz: no key (401) and a
        # false chunked claim.
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
        super().send_400_response(msg)

    def data_received(self, data: bytes) -> None:
        # uvicorn answers bytes h11 cannot parse with a 400 even where an earlier answer already ended the
        # connection (h11's MUST_CLOSE): h11 refuses to send it (LocalProtocolError) and asyncio logged a
        # traceback for each such connection (seen in the HTTP fuzz). The connection is over either way.
        try:
            super().data_received(data)
        except h11.LocalProtocolError:
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.serving():   # not: a pipelined request went on
            self._wait_for_head()

    def serving(self) -> bool:
        """A request head has arrived and its response is not sent yet: the one state never evicted."""
        return self.cycle is not None and not self.cycle.response_complete

    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def _wait_for_head(self) -> None:
        self.waiting_since = time.monotonic()
        self._stop_head_clock()
        self._head_clock = self.loop.call_later(self.limits.head_timeout_s, self._head_timed_out)

    def _stop_head_clock(self) -> None:
        if self._head_clock is not None:
            self._head_clock.cancel()
            self._head_clock = None

    def _head_timed_out(self) -> None:
        self._head_clock = None
        if self.serving() or not self.open():
            return   # the head arrived: the body has the app's own timeout
        if self.conn.their_state is h11.IDLE:   # no whole head yet (an unread body after a response: just close)
            self.transport.write(_raw_error(408, "Request Timeout", ApiError(
                408, f"the request head did not arrive within {self.limits.head_timeout_s:g} s",
                code="header_timeout")))
        self.transport.close()

    def _admit(self) -> None:
        """Make room for this connection: past its address's cap, that address's connection waiting longest
        for a request goes; past the total, anyone's. If every one of them is serving, this one is refused."""
        others = [c for c in self.connections if c is not self and isinstance(c, BoundedH11Protocol) and c.open()]
        key = client_key(self.client)
        own = [c for c in others if client_key(c.client) == key]
        if len(own) >= self.limits.per_address:
            crowd, why = own, f"{self.limits.per_address} connections from one address"
        elif len(others) >= self.limits.connections:
            crowd, why = others, f"{self.limits.connections} connections"
        else:
            return
        victim = _longest_waiting(crowd)
        if victim is not None:
            victim.transport.close()
            return
        self.transport.write(_raw_error(503, "Service Unavailable", ApiError(
            503, f"the server holds {why}, all of them serving a request: retry later", type="server_error",
            code="too_many_connections")))
        self.transport.close()


def _longest_waiting(connections: Iterable[BoundedH11Protocol]) -> BoundedH11Protocol | None:
    idle = [c for c in connections if not c.serving()]
    return min(idle, key=lambda c: c.waiting_since) if idle else None


def protocol_for(limits: Limits) -> type[BoundedH11Protocol]:
    """The protocol class uvicorn.Config(http=...) takes, bound to these limits."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"limits": limits})


class RequestSlots:
    """ASGI wrapper: at most `limit` requests in flight (GET /health is never counted nor refused); more are
    answered 503 with the route's API's error object at once. One event loop: a plain counter."""

    def __init__(self, app: Callable[..., Awaitable[None]], limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope["path"] == HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:
            await _refuse(send, scope["path"], ApiError(503, f"the server has {self.limit} requests in flight: "
                                                        "retry later", type="server_error", code="too_many_requests"))
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def _refuse(send: Callable[[Any], Awaitable[None]], path: str, error: ApiError) -> None:
    body = json.dumps(error.body_for(path)).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(RETRY_AFTER_S).encode())]})
    await send({"type": "http.response.body", "body": body})


def check_uvicorn() -> None:
    """Fail at start, in one line, if the installed uvicorn no longer has what BoundedH11Protocol relies on
    (the list in this module's docstring)."""
    import uvicorn
    from uvicorn.server import ServerState

    missing = [name for name in ("connection_made", "connection_lost", "on_response_complete", "data_received")
               if not callable(getattr(H11Protocol, name, None))]
    if list(inspect.signature(H11Protocol.__init__).parameters) != ["self", "config", "server_state", "app_state",
                                                                    "_loop"]:
        missing.append("H11Protocol(config, server_state, app_state, _loop)")
    for name in ("response_complete", "disconnected"):   # set in __init__ (no source needed to check)
        if name not in RequestResponseCycle.__init__.__code__.co_names:
            missing.append(f"RequestResponseCycle.{name}")
    if not callable(getattr(H11Protocol, "send_400_response", None)):
        missing.append("H11Protocol.send_400_response")
    state = ServerState()
    config = uvicorn.Config(_no_app, http=H11Protocol, ws="none", lifespan="off", log_config=None)
    probe = H11Protocol(config=config, server_state=state, app_state={}, _loop=asyncio.new_event_loop())
    try:
        for name, ok in (("connections", getattr(probe, "connections", None) is state.connections),
                         ("conn", isinstance(getattr(probe, "conn", None), h11.Connection)),
                         ("cycle", hasattr(probe, "cycle") and probe.cycle is None),
                         ("client", hasattr(probe, "client")), ("transport", hasattr(probe, "transport"))):
            if not ok:
                missing.append(f"H11Protocol.{name}")
    finally:
        probe.loop.close()
    if not isinstance(getattr(uvicorn.Server(config), "_captured_signals", None), list):   # server.py's shutdown
        missing.append("Server._captured_signals")
    if missing:
        raise BmoeError(f"uvicorn {uvicorn.__version__} changed what serve's connection limits rely on "
                        f"(bmoe_edge/serve/connections.py): {', '.join(missing)}")


async def _no_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    raise AssertionError("check_uvicorn's probe serves nothing")


class FewerRepeats(logging.Filter):
    """uvicorn warns once per connection whose bytes are not HTTP ("Invalid HTTP request received."), so any
    client could write to the journal at its connection rate. The same message passes at most `burst` times
    per `window_s`; past that, the first one let through again says how many were left out."""

    def __init__(self, burst: int = 10, window_s: float = 60.0) -> None:
        super().__init__()
        self.burst, self.window_s = burst, window_s
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int, int]] = {}   # message -> (window start, passed, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        key = str(record.msg)[:200]
        now = time.monotonic()
        with self._lock:
            start, passed, dropped = self._seen.get(key, (now, 0, 0))
            if now - start > self.window_s:
                if dropped:
                    record.msg = f"{record.msg} ({dropped} more like it in the last {self.window_s:g} s left out)"
                start, passed, dropped = now, 0, 0
            if passed >= self.burst:
                self._seen[key] = (start, passed, dropped + 1)
                return False
            self._seen[key] = (start, passed + 1, dropped)
            if len(self._seen) > 1000:   # many distinct messages: forget the oldest windows
                for old in sorted(self._seen, key=lambda k: self._seen[k][0])[:500]:
                    del self._seen[old]
            return True


def quiet_repeats(logger_name: str = "uvicorn.error") -> None:
    """Install FewerRepeats on uvicorn's error logger once (after uvicorn configured its logging)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, FewerRepeats) for f in logger.filters):
        logger.addFilter(FewerRepeats())
