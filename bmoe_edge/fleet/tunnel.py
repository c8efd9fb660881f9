"""RPC workers reached through SSH: one connection per board, and a port of this machine's loopback
forwarded to the worker on the board's loopback (SSH direct-tcpip channels, like `serve --host`).

The RPC protocol has no authentication or encryption, so a worker listens on its own 127.0.0.1 only
(`bmoe-edge rpc-worker`'s default) and the main board comes in over SSH, with the host keys checked
as for a deploy: nobody else on the network can drive the worker or read the weights it is sent.
Loopback is not private to a user, though: every local user of the board can reach its worker, and
every local user of this machine the tunnel's end while it is open (docs/rpc.md, "Who can reach a
worker"). The tunnel's local port is held from the moment it is chosen (_forward_local).
"""

from __future__ import annotations

import contextlib
import socket
import threading
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


ACCEPT_POLL = 0.1     # seconds between looks at whether the block has ended, while no client connects


@contextlib.contextmanager
def _forward_local(board: Board, remote_port: int) -> Iterator[int]:
    """A port of this machine's 127.0.0.1 forwarded to the board's 127.0.0.1:remote_port; yields the port.

    The listening socket is bound to port 0 and listens at once, held until the block ends: the kernel
    picks the port and it is never free in between. (fabric's forward_local binds a port it is given in
    a thread of its own: choosing one by binding and closing a socket left a gap in which another local
    process could take it, and the engine would then have sent its tensors to that process.) Each
    connection becomes an SSH direct-tcpip channel, pumped by fabric's Tunnel."""
    import paramiko  # host-only (the host extra), like fabric
    from fabric.tunnels import Tunnel

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(ACCEPT_POLL)
    finished = threading.Event()
    tunnels: list[Tunnel] = []

    def accept() -> None:
        while not finished.is_set():
            try:
                sock, peer = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return      # the listener closed under us
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # as OpenSSH's forwarding does
            try:
                channel = board.transport().open_channel("direct-tcpip", ("127.0.0.1", remote_port), peer)
            except (BmoeError, paramiko.SSHException, OSError, EOFError):   # refused, or the board went away
                sock.close()
                continue
            tunnel = Tunnel(channel=channel, sock=sock, finished=finished)
            tunnel.start()
            tunnels.append(tunnel)

    acceptor = threading.Thread(target=accept, name=f"rpc tunnel to {board.label}", daemon=True)
    acceptor.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        finished.set()
        acceptor.join()
        listener.close()
        for tunnel in tunnels:
            tunnel.join()


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
            port = target.rpc_port or worker_port
            local = stack.enter_context(_forward_local(board, port))
            endpoints.append(f"127.0.0.1:{local}")
            if say is not None:
                say(f"rpc: 127.0.0.1:{local} -> {board.label} 127.0.0.1:{port} (SSH tunnel)")
        yield endpoints
