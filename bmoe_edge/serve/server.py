"""`bmoe-edge serve`: bind the port first (a port in use is one line, before the model loads), load the
engine, start its worker, and run uvicorn on the bound socket until interrupted."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bmoe_edge.engine import native, serve_options
from bmoe_edge.engine.prompt_cache import Budget
from bmoe_edge.engine.session import Engine
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError
from bmoe_edge.net import is_loopback
from bmoe_edge.serve import limits

DEFAULT_PORT: int = serve_options.BY_NAME["port"].default  # type: ignore[assignment]
MAX_CONNECTIONS: int = serve_options.BY_NAME["max_connections"].default  # type: ignore[assignment]
QUEUE: int = serve_options.BY_NAME["queue"].default  # type: ignore[assignment]


def listen(bind: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(bind).version == 6 else socket.AF_INET
    except ValueError:
        raise BmoeError(f"--bind takes an IP address (e.g. 127.0.0.1 or 0.0.0.0), got {bind!r}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind, port))
    except OSError as exc:
        sock.close()
        raise BmoeError(f"cannot listen on {bind}:{port}: {exc.strerror} (another server there? try --port)") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def check_auth(bind: str, api_keys: Sequence[str], no_auth: bool) -> None:
    """Fail closed: beyond loopback a key is needed, unless --no-auth says otherwise out loud."""
    if any(not k.strip() for k in api_keys):
        raise BmoeError("an API key is empty")
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        raise BmoeError(f"--bind takes an IP address (e.g. 127.0.0.1 or 0.0.0.0), got {bind!r}") from None
    if serve_options.needs_key(bind, bool(api_keys), no_auth):
        raise BmoeError(f"--bind {bind} without an API key would let anyone who reaches the port use the model: "
                        "give --api-key-file (or $BMOE_EDGE_API_KEY), or --no-auth to mean it")


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, whose shutdown first stops the worker taking jobs: /health says "shutting down",
        queued jobs are answered 503, the running one stops between two tokens, so open connections end
        within the grace period instead of waiting it out."""

        def __init__(self, worker: Any, config: uvicorn.Config) -> None:
            super().__init__(config)
            self.worker = worker

        async def shutdown(self, sockets: Any = None) -> None:
            self.worker.stop_taking_jobs()
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """uvicorn raises a SIGTERM or SIGINT it caught again once it has shut down, so the process died
            by it before `serve` closed the engine, the worker and the prompt cache's directory (one left in
            /tmp at every stop); forgetting it lets `serve` end by its own path (exit 0, or 1 on a failure)."""
            with super().capture_signals():
                try:
                    yield
                finally:
                    self._captured_signals.clear()

    return Server


def _uvicorn_server(worker: Any, config: Any) -> Any:
    return _server_class()(worker, config)


def _uvicorn_config(app: Any, limits: Any) -> Any:
    """uvicorn with our connection limits (serve/connections.py) in place of its limit_concurrency, which
    counted idle sockets and /health alike; no WebSocket upgrade (a connection that upgrades leaves the
    accounting)."""
    import uvicorn

    from bmoe_edge.serve import connections

    config = uvicorn.Config(connections.RequestSlots(app, limits.requests), http=connections.protocol_for(limits),
                            ws="none", log_level="warning", timeout_graceful_shutdown=5,
                            timeout_keep_alive=limits.keep_alive_s)
    connections.quiet_repeats()   # after the Config: it configures uvicorn's loggers
    return config


WATCH_S = 0.2
EXIT_AFTER_S = 1.0   # /health answers 503 this long before the server goes (a load balancer sees why)


def _watch(worker: Any, server: Any) -> None:
    """Stop the server once it cannot answer (its engine thread gone, the engine failing every request):
    /health says 503 at once; exiting non-zero lets the service manager start a new one."""
    while not server.should_exit:
        reason = worker.unavailable()
        if reason is not None and not worker.closing:
            time.sleep(EXIT_AFTER_S)
            worker.failure = worker.failure or reason
            server.should_exit = True
            return
        time.sleep(WATCH_S)


def _weak_listener(method: Callable[[str], None]) -> Callable[[str], None]:
    """The native side keeps a fatal listener for the process's life (native/python/module.cpp): given the bound
    method itself, the worker, and the chat templates it holds, outlived the engine and nanobind reported them
    leaked at every stop. This one reaches the worker through a weak reference."""
    ref = weakref.WeakMethod(method)

    def listener(line: str) -> None:
        target = ref()
        if target is not None:
            target(line)
    return listener


def serve(model: Path, config: StreamConfig, *, bind: str = "127.0.0.1", port: int = DEFAULT_PORT,
          api_keys: Sequence[str] = (), no_auth: bool = False, allowed_hosts: Sequence[str] = (),
          cors_origins: Sequence[str] = (), max_connections: int = MAX_CONNECTIONS,
          body_timeout_s: float = limits.BODY_TIMEOUT_S, queue_size: int = QUEUE, template: str | None = None,
          parse_special: bool = False, model_id: str | None = None, prompt_cache_mb: int | None = None,
          with_ui: bool = True, say: Callable[[str], None] = print) -> None:
    # uvicorn and Starlette (app, worker) load when a server starts, not when this module is imported.
    from bmoe_edge.serve import connections
    from bmoe_edge.serve.app import create_app
    from bmoe_edge.serve.worker import Worker

    check_auth(bind, api_keys, no_auth)
    connections.check_uvicorn()
    limits = connections.Limits.for_max_connections(max_connections)   # a bad $BMOE_EDGE_SERVE_HEAD_TIMEOUT: now
    sock = listen(bind, port)
    if not is_loopback(bind) and not api_keys:
        say(f"warning: listening on {bind} without an API key (--no-auth): anyone who reaches this port can "
            "use the model")
    name = model_id or model.name
    try:
        # long prompts kept (docs/serve.md), each API key a tenant with its share of the budget
        budget = Budget(prompt_cache_mb, tenants=max(1, len(api_keys)))
        with Engine(model, config, prompt_cache_kind="dir", prompt_cache_budget=budget) as engine:
            worker = Worker(engine, queue_size=queue_size, template=template, parse_special=parse_special)
            native.load().set_fatal_listener(_weak_listener(worker.fatal))
            if worker.template.note:
                say(f"note: {worker.template.note}")
            app = create_app(worker, name, api_keys, bind=bind, allowed_hosts=allowed_hosts,
                             cors_origins=cors_origins, body_timeout_s=body_timeout_s, with_ui=with_ui)
            host, bound_port = sock.getsockname()[:2]
            page = f"chat page http://{host}:{bound_port}/; " if with_ui else ""
            say(f"serving {name} on http://{host}:{bound_port}/v1 ({page}queue {queue_size}; Ctrl-C stops)")
            server = _uvicorn_server(worker, _uvicorn_config(app, limits))
            watch = threading.Thread(target=_watch, args=(worker, server), name="bmoe-watch", daemon=True)
            watch.start()
            try:
                server.run(sockets=[sock])
            finally:
                native.load().set_fatal_listener(None)
                worker.close(timeout=0 if worker.failure else 30)
                # The watch's frame holds the worker: a daemon thread still asleep at exit would keep it (and
                # the chat templates it holds) past the engine (nanobind's "leaked" lines on a slow board).
                server.should_exit = True
                watch.join(timeout=EXIT_AFTER_S + 2 * WATCH_S)
            if worker.failure is not None:   # a server that cannot serve exits non-zero: systemd restarts it
                raise BmoeError(f"the server stopped: {worker.failure}")
    finally:
        sock.close()
