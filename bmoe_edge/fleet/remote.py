"""The SSH connection to a board (fabric): ssh configuration, jump hosts, liveness, deadlines per fleet
worker. Which boards: targets.py; their host keys: host_keys.py; running commands on one: commands.py.

No hand-written SSH: every connection is a `fabric.Connection` (paramiko underneath). What this adds:

- **SSH configuration**: `~/.ssh/config` (and `/etc/ssh/ssh_config`) through fabric, or one file given
  with `--ssh-config FILE` / `$BMOE_EDGE_SSH_CONFIG` (then only that one, like `ssh -F`). `User`,
  `Port`, `HostName`, `IdentityFile`, `ProxyJump`, `UserKnownHostsFile` and `StrictHostKeyChecking`
  (`accept-new`/`no` = accept unknown keys, never changed ones) are honoured; agent keys are used.
- **ProxyJump hops** are built here, with the same ssh config and the same strict host-key policy as the
  board (fabric's own hops accept any key).
- **Liveness**: a probe every KEEPALIVE seconds closes the connection of a board that stopped answering;
  a fleet worker's connections close together at its host deadline (Watch).
- Expected failures become one-line BmoeErrors naming the host (unreachable, authentication, host key).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import channel, host_keys
from bmoe_edge.fleet.targets import Target, parse_target

SSH_CONFIG_ENV = "BMOE_EDGE_SSH_CONFIG"
CONNECT_TIMEOUT = 15.0
KEEPALIVE = 15.0          # seconds between liveness probes (ServerAliveInterval)
KEEPALIVE_COUNT = 3       # unanswered probes before the board counts as dead (ServerAliveCountMax)
_watch = threading.local()   # the fleet Watch of this worker thread (parallel.run_fleet), if any


@dataclass(frozen=True)
class SshOptions:
    ssh_config: Path | None = None       # None: $BMOE_EDGE_SSH_CONFIG, else ~/.ssh/config + /etc/ssh/ssh_config
    accept_new_host_key: bool = False
    connect_timeout: float = CONNECT_TIMEOUT
    keepalive: float = KEEPALIVE            # 0: no liveness probe
    keepalive_count: int = KEEPALIVE_COUNT

    def config_path(self) -> Path | None:
        if self.ssh_config is not None:
            return Path(self.ssh_config).expanduser()
        env = os.environ.get(SSH_CONFIG_ENV)
        return Path(env).expanduser() if env else None


def _jump_chain(spec: str, config: Any, options: SshOptions) -> Any:
    """The fabric Connection of a ProxyJump chain (`a,b`: through a then b), every hop with the same
    strict host-key policy and the same ssh config as the board (fabric's own hops accept any key)."""
    from fabric import Connection  # host-only (the host extra): a board never opens SSH

    gateway = None
    for hop in spec.split(","):
        t = parse_target(hop.strip().removeprefix("ssh://"))
        lookup = config.base_ssh_config.lookup(t.host)
        conn = Connection(t.host, user=t.user, port=t.port, config=config, gateway=gateway,
                          connect_timeout=int(options.connect_timeout))
        host_keys.strict(conn.client, lookup, options.accept_new_host_key)
        gateway = conn
    return gateway


class BoardConnection:
    """An SSH connection to one board (a fabric Connection with strict host keys); commands.Board runs
    commands over it."""

    def __init__(self, target: Target, options: SshOptions | None = None, *,
                 default_user: str | None = None, default_port: int | None = None) -> None:
        from fabric import Config, Connection  # host-only (the host extra): a board never opens SSH

        self.target = target
        self.options = options or SshOptions()
        self.liveness: channel.Liveness | None = None
        path = self.options.config_path()
        if path is not None and not path.is_file():
            raise BmoeError(f"ssh config {path} does not exist")
        try:
            config = Config(runtime_ssh_path=str(path)) if path else Config()
        except Exception as exc:   # paramiko's config parser raises assorted errors
            raise BmoeError(f"ssh config {path or '~/.ssh/config'}: {exc}") from None
        lookup = config.base_ssh_config.lookup(target.host)
        user = target.user or (None if "user" in lookup else default_user)
        port = target.port or (None if "port" in lookup else default_port)
        jump = str(lookup.get("proxyjump", "none"))
        gateway = None if jump.lower() == "none" else _jump_chain(jump, config, self.options)
        self.conn = Connection(target.host, user=user, port=port, config=config, gateway=gateway,
                               connect_timeout=int(self.options.connect_timeout))
        host = f"[{target.host}]" if ":" in target.host else target.host
        self.label = f"{self.conn.user}@{host}:{self.conn.port}"
        self.known_hosts = host_keys.strict(self.conn.client, lookup, self.options.accept_new_host_key)
        self.opened = False

    def accept_command(self) -> str:
        return host_keys.accept_command(self.conn.host, self.conn.port, self.known_hosts[0])

    def open(self) -> Self:
        import paramiko

        if self.opened:
            return self
        where = f"{self.conn.user}@{self.conn.host}:{self.conn.port}"
        try:
            self.conn.open()
        except host_keys.UnknownHostKey as exc:
            hop = "" if exc.name in (self.conn.host, f"[{self.conn.host}]:{self.conn.port}") else \
                f" of jump host {exc.name}"
            raise BmoeError(
                f"{self.label}: unknown host key{hop} ({exc.key_type} {exc.fingerprint}, not in "
                f"{host_keys.show_home(self.known_hosts[0])}); check it, then accept it with "
                f"`{self.accept_command()}` or run again with --accept-new-host-key") from None
        except paramiko.BadHostKeyException as exc:
            raise BmoeError(
                f"{self.label}: the host key CHANGED ({exc.key.get_name()}) since it was recorded in "
                f"{host_keys.show_home(self.known_hosts[0])}: refusing (if the board was reinstalled: "
                f"`ssh-keygen -R {shlex.quote(exc.hostname)}`, then accept the new key)") from None
        except paramiko.AuthenticationException as exc:
            raise BmoeError(f"{self.label}: authentication failed for user {self.conn.user} ({exc}); "
                            "the keys tried come from ssh-agent, ~/.ssh/id_* and IdentityFile in your "
                            "ssh config") from None
        except (socket.gaierror, paramiko.ssh_exception.NoValidConnectionsError, TimeoutError,
                ConnectionError, OSError, EOFError, paramiko.SSHException) as exc:
            raise BmoeError(f"{self.label}: cannot reach {where}: {reason(exc)}") from None
        self.opened = True
        _no_delay(self.conn.transport)
        if self.options.keepalive > 0:
            self.liveness = channel.Liveness(self.conn.transport, self.options.keepalive,
                                             self.options.keepalive_count, self.abort)
        watching = getattr(_watch, "current", None)
        if watching is not None:
            watching.add(self)
        return self

    def abort(self) -> None:
        """Close the connection from another thread (a dead board, a host deadline): whatever waits on
        it fails at once."""
        transport = self.conn.transport
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()

    def close(self) -> None:
        if self.liveness is not None:
            self.liveness.stop.set()
        self.opened = False
        gateway = self.conn
        while gateway is not None and not isinstance(gateway, str):
            with contextlib.suppress(Exception):
                gateway.close()
            gateway = gateway.gateway

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def transport(self) -> Any:
        transport = self.conn.transport
        if transport is None or not transport.is_active():
            raise BmoeError(f"{self.label}: the connection is closed"
                            + (" (the board stopped answering keepalives)" if self._dead() else ""))
        return transport

    def _dead(self) -> bool:
        return self.liveness is not None and self.liveness.dead


def _no_delay(transport: Any) -> None:
    """TCP_NODELAY on the connection's socket, as OpenSSH's client sets it: every command is a few small
    packets each way (open the channel, exec, exit status), and with Nagle's algorithm each waits for the
    board's delayed ACK (~40 ms). Through a jump host the "socket" is a channel: nothing to set."""
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Watch:
    """The connections one fleet worker opened (parallel.run_fleet): aborted together at its deadline."""

    def __init__(self) -> None:
        self.boards: list[BoardConnection] = []
        self.expired = False
        self.lock = threading.Lock()

    def add(self, board: BoardConnection) -> None:
        with self.lock:
            self.boards.append(board)
            if self.expired:
                board.abort()

    def expire(self) -> None:
        with self.lock:
            self.expired = True
            for board in self.boards:
                board.abort()


@contextlib.contextmanager
def watched(watch: Watch) -> Iterator[Watch]:
    """Boards opened by this thread inside the block register with `watch`."""
    before = getattr(_watch, "current", None)
    _watch.current = watch
    try:
        yield watch
    finally:
        _watch.current = before


def reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out ({text})"
    return text
