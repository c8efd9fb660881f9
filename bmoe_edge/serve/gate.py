"""Browsers stay out unless let in: every HTTP request passes the gate before any route.

- `Host` must name this server: a loopback name (localhost, 127.0.0.1, ::1), the address it is bound
  to, an IP address when it is bound to all of them (0.0.0.0, ::), or an `--allowed-host` name. A page
  that rebinds its own name to this machine's address (DNS rebinding) sends its own name: refused (403).
- A request with `Origin` (a browser's cross-site request) is refused (403) unless `--cors-origin`
  allows that origin; then the answers carry CORS headers and a preflight (OPTIONS) is answered here.
  An Origin that is this server itself (`http://` + the Host it was reached by, which the Host check has
  already let in) is the chat page (ui.py) calling its own API: let in, as a browser lets it in.
- A POST body must be declared `application/json` (415): a browser's "simple" request (text/plain,
  form data) never reaches the JSON parser, so a page cannot post to it without a preflight.

Clients that are not browsers send no Origin and the right Content-Type: nothing changes for them."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from bmoe_edge.serve.api_errors import ApiError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = ("authorization", "content-type", "x-api-key", "anthropic-version")
CORS_MAX_AGE_S = 600

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def hostname(host: str) -> str:
    """The name in a Host header, without its port, brackets, case or final dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Gate:
    def __init__(self, app: Callable, *, bind: str = "127.0.0.1", allowed_hosts: Iterable[str] = (),
                 cors_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.hosts = set(LOOPBACK_NAMES) | {hostname(h) for h in allowed_hosts}
        self.any_host = "*" in self.hosts
        self.any_ip = False
        try:
            address = ipaddress.ip_address(bind)
            self.any_ip = address.is_unspecified
            self.hosts.add(str(address))
        except ValueError:
            pass
        self.origins = {o.rstrip("/").lower() for o in cors_origins}
        self.any_origin = "*" in self.origins

    def host_allowed(self, host: str | None) -> bool:
        if host is None:   # HTTP/1.0 without Host: not a browser (browsers always send it)
            return True
        name = hostname(host)
        return self.any_host or name in self.hosts or (self.any_ip and _is_ip(name))

    def origin_allowed(self, origin: str) -> bool:
        return self.any_origin or origin.rstrip("/").lower() in self.origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        method, path = scope.get("method", "GET"), scope.get("path", "")
        if not self.host_allowed(headers.get("host")):
            await _refuse(send, path, 403, f"the Host {headers['host'][:100]!r} is not a name this server answers to "
                          "(loopback, its address, or --allowed-host NAME)", "host_not_allowed")
            return
        origin = headers.get("origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None and not same_origin(origin, headers.get("host")):
            if not self.origin_allowed(origin):
                await _refuse(send, path, 403, f"requests from the web origin {origin[:100]!r} are refused "
                              "(--cors-origin ORIGIN lets one in)", "origin_not_allowed")
                return
            cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin"),
                    (b"access-control-expose-headers", b"Retry-After")]
            if method == "OPTIONS" and "access-control-request-method" in headers:
                await _preflight(send, cors, headers)
                return
        if method == "POST" and _media_type(headers.get("content-type", "")) != "application/json":
            await _refuse(send, path, 415, "a request body must be JSON, sent with 'Content-Type: application/json'",
                          "unsupported_media_type", cors)
            return
        if not cors:
            await self.app(scope, receive, send)
            return

        async def with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, with_cors)


def same_origin(origin: str, host: str | None) -> bool:
    """Whether `origin` is this server as the request reached it: a page this server served (the chat page)
    calling its own API. Safe because the Host was checked first: a rebound name never gets this far."""
    return host is not None and origin.rstrip("/").lower() in (f"http://{host.strip().lower()}",
                                                                 f"https://{host.strip().lower()}")


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


async def _preflight(send: Send, cors: list[tuple[bytes, bytes]], headers: dict[str, str]) -> None:
    asked = [h.strip().lower() for h in headers.get("access-control-request-headers", "").split(",") if h.strip()]
    allowed = ", ".join(dict.fromkeys([*CORS_HEADERS, *(h for h in asked if h in CORS_HEADERS)]))
    out = [*cors, (b"access-control-allow-methods", CORS_METHODS.encode()),
           (b"access-control-allow-headers", allowed.encode()),
           (b"access-control-max-age", str(CORS_MAX_AGE_S).encode()), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 204, "headers": out})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(send: Send, path: str, status: int, message: str, code: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(ApiError(status, message, code=code).body_for(path)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
