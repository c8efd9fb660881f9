"""`bmoe-edge serve`: bind the port first (a port in use is one line, before the model loads), load the
engine, start its worker, and run uvicorn on the bound socket until interrupted."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path

from bmoe_edge.engine.session import Engine
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError
from bmoe_edge.net import is_loopback

DEFAULT_PORT = 8080


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


def serve(model: Path, config: StreamConfig, *, bind: str = "127.0.0.1", port: int = DEFAULT_PORT,
          api_key: str | None = None, queue_size: int = 8, template: str | None = None,
          parse_special: bool = False, model_id: str | None = None, say: Callable[[str], None] = print) -> None:
    # uvicorn and Starlette (app, worker) load when a server starts, not when this module is imported.
    import uvicorn

    from bmoe_edge.serve.app import create_app
    from bmoe_edge.serve.worker import Worker

    sock = listen(bind, port)
    if not is_loopback(bind) and not api_key:
        say(f"warning: listening on {bind} without --api-key: anyone who reaches this port can use the model")
    name = model_id or model.name
    try:
        with Engine(model, config) as engine:
            worker = Worker(engine, queue_size=queue_size, template=template, parse_special=parse_special)
            if worker.template.note:
                say(f"note: {worker.template.note}")
            app = create_app(worker, name, api_key)
            host, bound_port = sock.getsockname()[:2]
            say(f"serving {name} on http://{host}:{bound_port}/v1 (queue {queue_size}; Ctrl-C stops)")
            server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
            try:
                server.run(sockets=[sock])
            finally:
                worker.close()
    finally:
        sock.close()
