"""SSH to boards (fabric): targets and inventories, connections with strict host keys, remote commands.

No hand-written SSH: every connection is a `fabric.Connection` (paramiko underneath). What this adds:

- **Targets**: `USER@HOST[:PORT]` strings and inventory YAML files (hosts with their board names and
  optional user, port, install dir and role: `rpc-worker` boards lend their memory to a main board's
  run, docs/rpc.md).
- **SSH configuration**: `~/.ssh/config` (and `/etc/ssh/ssh_config`) through fabric, or one file given
  with `--ssh-config FILE` / `$BMOE_EDGE_SSH_CONFIG` (then only that one, like `ssh -F`). `User`,
  `Port`, `HostName`, `IdentityFile`, `ProxyJump`, `UserKnownHostsFile` and `StrictHostKeyChecking`
  (`accept-new`/`no` = accept unknown keys, never changed ones) are honoured; agent keys are used.
- **Host keys**: strict by default (fabric's own default is to accept any key), on the board and on
  every ProxyJump hop (the hops are built here, with the same ssh config and policy). An unknown host
  is refused with the command that accepts it; `--accept-new-host-key` adds it to the known_hosts
  file; a changed key is always refused. `@cert-authority`/`@revoked` lines are refused with a message
  (paramiko would read them as plain keys).
- **Remote commands** (channel.py): fixed scripts run as `sh -s` with `set -- ARGS…` (each quoted with
  `shlex.quote`) on stdin, so paths and prompts are data, never shell code, and the login shell never
  parses them; files travel over exec channels too (no SFTP). Every command has a deadline; a
  liveness probe closes the connection of a board that stopped answering. Expected failures become
  one-line BmoeErrors naming the host (unreachable, authentication, host key, a failed step with its
  stderr, a deadline).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import channel
from bmoe_edge.fleet.channel import Result
from bmoe_edge.fleet.scripts import READ, REQUEST, REQUEST_DIR, WRITE

SSH_CONFIG_ENV = "BMOE_EDGE_SSH_CONFIG"
CONNECT_TIMEOUT = 15.0
KEEPALIVE = 15.0          # seconds between liveness probes (ServerAliveInterval)
KEEPALIVE_COUNT = 3       # unanswered probes before the board counts as dead (ServerAliveCountMax)
STEP_TIMEOUT = 600.0      # default deadline of one remote step
MIN_RATE = 256 * 1024     # bytes/s an upload is allowed before its deadline (plus STEP_TIMEOUT)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_known_hosts_lock = threading.Lock()
_watch = threading.local()   # the fleet Watch of this worker thread (parallel.run_fleet), if any


# ---------------------------------------------------------------------------------------------------
# Targets and inventories.


@dataclass(frozen=True)
class Target:
    """One board to reach: a host (name or address), maybe a user/port, its board and install dir."""

    host: str
    user: str | None = None
    port: int | None = None
    board: str | None = None
    install_dir: str | None = None
    role: str | None = None         # None: a board that runs models; ROLES
    rpc_port: int | None = None     # role rpc-worker: its worker's port on the board (None: the default)

    @property
    def label(self) -> str:
        """How the user wrote it (what reports show): [user@]host[:port]."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")


def parse_target(spec: str, *, board: str | None = None, install_dir: str | None = None) -> Target:
    """`USER@HOST[:PORT]`, `HOST`, `[v6addr]:PORT`; BmoeError for anything else."""
    text = spec.strip()
    user = None
    if "@" in text:
        user, _, text = text.rpartition("@")
        if not user or any(c.isspace() for c in user):
            raise BmoeError(f"host {spec!r}: the user before '@' is empty or has spaces")
    port: int | None = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise BmoeError(f"host {spec!r}: expected [ADDRESS]:PORT")
            port = _port(rest[1:], spec)
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = _port(p, spec)
    else:
        host = text   # a name, an IPv4 address, or a bare IPv6 address
    if not host or any(c.isspace() or c in "/'\"`$\\;&|<>" for c in host):
        raise BmoeError(f"host {spec!r}: expected USER@HOST[:PORT]")
    return Target(host=host, user=user, port=port, board=board, install_dir=install_dir)


def _port(text: str, spec: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise BmoeError(f"host {spec!r}: port {text!r} is not a number from 1 to 65535")
    return int(text)


_INVENTORY_KEYS = {"host", "board", "user", "port", "install_dir", "role", "rpc_port"}
# What a board is for in a fleet; a board without a role runs models (and may use the workers).
ROLES = ("rpc-worker",)


def load_inventory(path: Path) -> list[Target]:
    """Targets from an inventory YAML file:

        defaults: {board: rpi5, user: pi}          # optional, for every host
        hosts:
          - pi@kitchen.local                       # USER@HOST[:PORT]
          - {host: 10.0.0.7, port: 2222, board: rpi4, install_dir: /opt/bmoe-edge}
          - {host: pi-b.local, role: rpc-worker, rpc_port: 50052}   # lends its RAM (docs/rpc.md)
    """
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BmoeError(f"inventory {path} does not exist") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BmoeError(f"inventory {path}: cannot read it: {' '.join(str(exc).split())}") from None
    if isinstance(data, list):
        data = {"hosts": data}
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), list) or not data["hosts"]:
        raise BmoeError(f"inventory {path}: expected a list `hosts:` with at least one host")
    unknown = set(data) - {"hosts", "defaults"}
    if unknown:
        raise BmoeError(f"inventory {path}: unknown top-level key {sorted(unknown)[0]!r} (hosts, defaults)")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict) or set(defaults) - (_INVENTORY_KEYS - {"host"}):
        raise BmoeError(f"inventory {path}: `defaults` takes {', '.join(sorted(_INVENTORY_KEYS - {'host'}))}")
    out = []
    for i, item in enumerate(data["hosts"]):
        where = f"inventory {path}: hosts[{i}]"
        entry = {"host": item} if isinstance(item, str) else item
        if not isinstance(entry, dict) or not isinstance(entry.get("host"), str):
            raise BmoeError(f"{where}: expected USER@HOST[:PORT] or a mapping with `host:`")
        bad = set(entry) - _INVENTORY_KEYS
        if bad:
            raise BmoeError(f"{where}: unknown key {sorted(bad)[0]!r} (known: {', '.join(sorted(_INVENTORY_KEYS))})")
        merged = {**defaults, **{k: v for k, v in entry.items() if v is not None}}
        target = parse_target(entry["host"])
        user, port = target.user, target.port
        if "user" in entry and user is not None:
            raise BmoeError(f"{where}: the user is given twice (in `host:` and `user:`)")
        if "port" in entry and port is not None:
            raise BmoeError(f"{where}: the port is given twice (in `host:` and `port:`)")
        user = user or merged.get("user")
        port = port if port is not None else merged.get("port")
        for key, value in (("port", port), ("rpc_port", merged.get("rpc_port"))):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535):
                raise BmoeError(f"{where}: {key} {value!r} is not a number from 1 to 65535")
        role = merged.get("role")
        if role is not None and role not in ROLES:
            raise BmoeError(f"{where}: role {role!r} is not one of {', '.join(ROLES)} (leave it out for a board "
                            "that runs models)")
        if merged.get("rpc_port") is not None and role != "rpc-worker":
            raise BmoeError(f"{where}: rpc_port goes with role: rpc-worker")
        for key in ("board", "install_dir", "user"):
            value = merged.get(key) if key != "user" else user
            if value is not None and not isinstance(value, str):
                raise BmoeError(f"{where}: {key} must be a string")
        install_dir = merged.get("install_dir")
        if install_dir is not None and not str(install_dir).startswith("/"):
            raise BmoeError(f"{where}: install_dir {install_dir!r} must be an absolute path")
        out.append(Target(target.host, user, port, merged.get("board"), install_dir, role, merged.get("rpc_port")))
    return out


def check_name(value: str, what: str) -> str:
    """Board names and bundle ids become path components on the board: keep them plain."""
    if not _NAME.match(value or "") or ".." in value:
        raise BmoeError(f"{what} {value!r} is not a plain name (letters, digits, '.', '_', '+', '-')")
    return value


# ---------------------------------------------------------------------------------------------------
# Connections.


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


class UnknownHostKey(Exception):
    def __init__(self, name: str, key_type: str, fingerprint: str) -> None:
        super().__init__(name)
        self.name, self.key_type, self.fingerprint = name, key_type, fingerprint


class _HostKeyPolicy:
    """paramiko MissingHostKeyPolicy: refuse unknown hosts, or add them (accept-new) to known_hosts."""

    def __init__(self, accept_new: bool, known_hosts: Path) -> None:
        self.accept_new = accept_new
        self.known_hosts = known_hosts

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        import base64
        import hashlib

        digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
        if not self.accept_new:
            raise UnknownHostKey(hostname, key.get_name(), f"SHA256:{digest}")
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _known_hosts_lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(self.known_hosts, "a", encoding="utf-8") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _shell_path(path: Path) -> str:
    """A path for a command to paste: ~/... when under the home directory and plain, else quoted."""
    home = str(Path.home())
    text = str(path)
    if text.startswith(home + "/") and shlex.quote(text[len(home) + 1:]) == text[len(home) + 1:]:
        return "~/" + text[len(home) + 1:]
    return shlex.quote(text)


def _show_home(path: Path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if text == home or text.startswith(home + "/") else text


def _known_hosts_files(lookup: Mapping[str, Any]) -> list[Path]:
    files = str(lookup.get("userknownhostsfile", "~/.ssh/known_hosts")).split()
    return [Path(os.path.expanduser(f)) for f in files]


def _strict(client: Any, lookup: Mapping[str, Any], options: SshOptions) -> list[Path]:
    """Host keys of an SSH client checked strictly: the known_hosts files (markers refused with a clear
    message), unknown keys refused (or recorded when accept-new), changed keys always refused."""
    known = _known_hosts_files(lookup)
    for f in known:
        if f.is_file():
            check_known_hosts(f)
            try:
                client.load_host_keys(str(f))
            except Exception as exc:   # a malformed line
                raise BmoeError(f"known hosts file {f}: {exc}") from None
    system = Path("/etc/ssh/ssh_known_hosts")
    if system.is_file():
        with contextlib.suppress(Exception):
            client.load_system_host_keys(str(system))
    strict = str(lookup.get("stricthostkeychecking", "yes")).lower()
    accept_new = options.accept_new_host_key or strict in ("accept-new", "no", "off")
    client.set_missing_host_key_policy(_HostKeyPolicy(accept_new, known[0]))
    return known


def check_known_hosts(path: Path) -> None:
    """paramiko reads `@cert-authority` and `@revoked` lines as plain keys (a revoked key would be
    trusted): refuse such a file with what to do instead."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for n, line in enumerate(lines, 1):
        word = line.strip().split(" ", 1)[0]
        if word in ("@cert-authority", "@revoked"):
            raise BmoeError(f"known hosts file {path}, line {n}: {word} lines are not supported by bmoe-edge's "
                            "SSH client (host certificates and revocations would be misread): list the boards' "
                            "host keys in a known_hosts file of their own (`UserKnownHostsFile` in the ssh "
                            "config for those hosts)")


def _jump_chain(spec: str, config: Any, options: SshOptions) -> Any:
    """The fabric Connection of a ProxyJump chain (`a,b`: through a then b), every hop with the same
    strict host-key policy and the same ssh config as the board (fabric's own hops accept any key)."""
    from fabric import Connection

    gateway = None
    for hop in spec.split(","):
        t = parse_target(hop.strip().removeprefix("ssh://"))
        lookup = config.base_ssh_config.lookup(t.host)
        conn = Connection(t.host, user=t.user, port=t.port, config=config, gateway=gateway,
                          connect_timeout=int(options.connect_timeout))
        _strict(conn.client, lookup, options)
        gateway = conn
    return gateway


class Board:
    """An SSH connection to one board (a fabric Connection with strict host keys), with helpers."""

    def __init__(self, target: Target, options: SshOptions | None = None, *,
                 default_user: str | None = None, default_port: int | None = None) -> None:
        from fabric import Config, Connection

        self.target = target
        self.options = options or SshOptions()
        self.liveness: channel.Liveness | None = None
        self._request_dir: str | None = None
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
        self.known_hosts = _strict(self.conn.client, lookup, self.options)
        self.opened = False

    # -- connection ---------------------------------------------------------------------------------

    def accept_command(self) -> str:
        port = self.conn.port
        keyscan = f"ssh-keyscan{f' -p {port}' if port != 22 else ''} {shlex.quote(self.conn.host)}"
        return f"{keyscan} >> {_shell_path(self.known_hosts[0])}"

    def open(self) -> Board:
        import paramiko

        if self.opened:
            return self
        where = f"{self.conn.user}@{self.conn.host}:{self.conn.port}"
        try:
            self.conn.open()
        except UnknownHostKey as exc:
            hop = "" if exc.name in (self.conn.host, f"[{self.conn.host}]:{self.conn.port}") else \
                f" of jump host {exc.name}"
            raise BmoeError(
                f"{self.label}: unknown host key{hop} ({exc.key_type} {exc.fingerprint}, not in "
                f"{_show_home(self.known_hosts[0])}); check it, then accept it with "
                f"`{self.accept_command()}` or run again with --accept-new-host-key") from None
        except paramiko.BadHostKeyException as exc:
            raise BmoeError(
                f"{self.label}: the host key CHANGED ({exc.key.get_name()}) since it was recorded in "
                f"{_show_home(self.known_hosts[0])}: refusing (if the board was reinstalled: "
                f"`ssh-keygen -R {shlex.quote(exc.hostname)}`, then accept the new key)") from None
        except paramiko.AuthenticationException as exc:
            raise BmoeError(f"{self.label}: authentication failed for user {self.conn.user} ({exc}); "
                            "the keys tried come from ssh-agent, ~/.ssh/id_* and IdentityFile in your "
                            "ssh config") from None
        except (socket.gaierror, paramiko.ssh_exception.NoValidConnectionsError, TimeoutError,
                ConnectionError, OSError, EOFError, paramiko.SSHException) as exc:
            raise BmoeError(f"{self.label}: cannot reach {where}: {_reason(exc)}") from None
        self.opened = True
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

    def __enter__(self) -> Board:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands -----------------------------------------------------------------------------------

    def transport(self) -> Any:
        transport = self.conn.transport
        if transport is None or not transport.is_active():
            raise BmoeError(f"{self.label}: the connection is closed"
                            + (" (the board stopped answering keepalives)" if self._dead() else ""))
        return transport

    def _dead(self) -> bool:
        return self.liveness is not None and self.liveness.dead

    def execute(self, command: str, *, what: str, stdin: channel.Data | None = None, keep_stdin: bool = False,
                check: bool = True, timeout: float | None = STEP_TIMEOUT, out: IO[str] | None = None,
                err: IO[str] | None = None) -> Result:
        """One command line on the board (fixed words only: the login shell parses it), with a deadline."""
        import paramiko

        try:
            result = channel.execute(self.transport(), command, stdin=stdin, keep_stdin=keep_stdin,
                                     timeout=timeout, out=out, err=err)
        except TimeoutError:   # the step's deadline, or a send that made no progress for 60 s
            after = f" after {timeout:.0f} s" if timeout is not None else ""
            raise BmoeError(f"{self.label}: {what}: timed out{after}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            why = "the board stopped answering (no keepalive reply)" if self._dead() else _reason(exc)
            raise BmoeError(f"{self.label}: {what}: {why}") from None
        if check and result.exited != 0:
            why = tail(result.stderr or result.stdout)
            raise BmoeError(f"{self.label}: {what} failed (exit {result.exited}): {why}")
        return result

    def sh(self, script: str, *args: str, what: str, check: bool = True, timeout: float | None = STEP_TIMEOUT,
           out: IO[str] | None = None, err: IO[str] | None = None, data: channel.Data | None = None,
           hangup: bool = False) -> Result:
        """Run a fixed script with its arguments on the board's `sh` (see channel: the login shell only
        sees `sh -s`). `data` goes to the script's stdin; `hangup` keeps stdin open (scripts.HANGUP)."""
        if data is None:
            text = channel.frame(script, args, keep_stdin=hangup)
            return self.execute("sh -s", what=what, stdin=text.encode(), keep_stdin=hangup, check=check,
                                timeout=timeout, out=out, err=err)
        name = channel.request_name()
        directory = self.request_dir()
        framed = channel.frame(script, args, keep_stdin=True, prelude='rm -f -- "$0"\n')
        self.execute("sh -s", what=f"{what} (sending the request)",
                     stdin=channel.frame(REQUEST, [directory, name, framed]).encode(), timeout=timeout)
        return self.execute(channel.request_command(directory, name), what=what, stdin=data, check=check,
                            timeout=timeout, out=out, err=err)

    def request_dir(self) -> str:
        """The board's private directory for requests and prompt files (created once per connection)."""
        if self._request_dir is None:
            text = channel.frame(REQUEST_DIR, [])
            found = self.execute("sh -s", what="creating the request directory", stdin=text.encode()).stdout
            self._request_dir = channel.plain_dir(found)
        return self._request_dir

    def put(self, local: Path, remote: str, timeout: float | None = None) -> None:
        """Upload a file over the exec channel (no SFTP needed); its mode comes along."""
        size = local.stat().st_size
        limit = timeout if timeout is not None else STEP_TIMEOUT + size / MIN_RATE
        mode = f"{local.stat().st_mode & 0o777:o}"
        self.sh(WRITE, remote, mode, "plain", what=f"upload of {local.name} to {remote}", data=local,
                timeout=limit)

    def read_bytes(self, remote: str) -> bytes | None:
        """A file's content, or None when it does not exist."""
        result = self.sh(READ, remote, what=f"reading {remote}", check=False)
        if result.exited == 3:
            return None
        if result.exited != 0:
            raise BmoeError(f"{self.label}: reading {remote} failed (exit {result.exited}): {tail(result.stderr)}")
        return result.raw

    def write_bytes(self, remote: str, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
        """Write a file atomically (a temporary name, then a rename over the target); durable: synced
        before the rename, its directory after."""
        self.sh(WRITE, remote, f"{mode:o}", "durable" if durable else "plain", what=f"writing {remote}",
                data=data)


class Watch:
    """The connections one fleet worker opened (parallel.run_fleet): aborted together at its deadline."""

    def __init__(self) -> None:
        self.boards: list[Board] = []
        self.expired = False
        self.lock = threading.Lock()

    def add(self, board: Board) -> None:
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


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out ({text})"
    return text


def tail(text: str, n: int = 1) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"
