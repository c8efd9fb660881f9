"""RPC workers reached through SSH: one connection per board, and a port of this machine's loopback
forwarded to the worker on the board's loopback (fabric's local forwarding, like `serve --host`).

The RPC protocol has no authentication or encryption, so a worker listens on its own 127.0.0.1 only
(`bmoe-edge rpc-worker`'s default) and the main board comes in over SSH, with the host keys checked
as for a deploy: nobody else on the network can drive the worker or read the weights it is sent.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bmoe_edge.engine.rpc import DEFAULT_PORT
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.commands import Board
from bmoe_edge.fleet.remote import SshOptions
from bmoe_edge.fleet.targets import Target, load_inventory, parse_target


def parse_hosts(text: str) -> list[Target]:
    """`--rpc-host USER@HOST[:SSHPORT][,...]`: the boards whose workers are reached over SSH."""
    return [parse_target(part.strip()) for part in text.split(",") if part.strip()]


def inventory_workers(path: Path) -> list[Target]:
    """`--inventory FILE`: its `role: rpc-worker` boards (each with its `rpc_port`, else --rpc-port)."""
    workers = [t for t in load_inventory(path) if t.role == "rpc-worker"]
    if not workers:
        raise BmoeError(f"inventory {path} has no host with `role: rpc-worker`: mark the boards that lend "
                        "their memory (docs/rpc.md)")
    return workers


def _free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, label: str, timeout: float = 10.0) -> None:
    """Until the tunnel's local end accepts. fabric binds it in a thread of its own after forward_local
    has returned, so a probe right away could be refused by a tunnel about to open (seen on a loaded
    machine). The test connection reaches the worker and closes at once; an rpc-server drops it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=timeout):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise BmoeError(f"the SSH tunnel to {label} did not open its local port 127.0.0.1:{port} "
                                f"within {timeout:g} s") from None
            time.sleep(0.05)


@contextlib.contextmanager
def rpc_tunnels(targets: Sequence[Target], options: SshOptions, worker_port: int = DEFAULT_PORT,
                say=None) -> Iterator[list[str]]:
    """Open the tunnels; yields the loopback endpoints (`127.0.0.1:PORT`, in the order of `targets`) that
    reach each board's 127.0.0.1 at its `rpc_port`, else `worker_port`. They close with the block (and
    with the connection)."""
    with contextlib.ExitStack() as stack:
        endpoints = []
        for target in targets:
            board = stack.enter_context(Board(target, options))
            local = _free_local_port()
            port = target.rpc_port or worker_port
            stack.enter_context(board.conn.forward_local(local, remote_port=port, remote_host="127.0.0.1",
                                                         local_host="127.0.0.1"))
            _wait_listening(local, board.label)
            endpoints.append(f"127.0.0.1:{local}")
            if say is not None:
                say(f"rpc: 127.0.0.1:{local} -> {board.label} 127.0.0.1:{port} (SSH tunnel)")
        yield endpoints
