"""SSH to boards (fabric): targets and inventories, connections with strict host keys, remote commands.

No hand-written SSH: every connection is a `fabric.Connection` (paramiko underneath). What this adds:

- **Targets**: `USER@HOST[:PORT]` strings and inventory YAML files (hosts with their board names and
  optional user, port and install dir).
- **SSH configuration**: `~/.ssh/config` (and `/etc/ssh/ssh_config`) through fabric, or one file given
  with `--ssh-config FILE` / `$BMOE_EDGE_SSH_CONFIG` (then only that one, like `ssh -F`). `User`,
  `Port`, `HostName`, `IdentityFile`, `ProxyJump`, `UserKnownHostsFile` and `StrictHostKeyChecking`
  (`accept-new`/`no` = accept unknown keys, never changed ones) are honoured; agent keys are used.
- **Host keys**: strict by default (fabric's own default is to accept any key). An unknown host is
  refused with the command that accepts it; `--accept-new-host-key` adds it to the known_hosts file; a
  changed key is always refused.
- **Remote commands**: every argument quoted with `shlex.quote`; scripts run as `sh -c SCRIPT sh ARGS…`
  so paths and prompts are data, never shell code. Expected failures become one-line BmoeErrors naming
  the host (unreachable, authentication, host key, a failed step with its stderr).
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import io
import os
import re
import shlex
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bmoe_edge.errors import BmoeError

SSH_CONFIG_ENV = "BMOE_EDGE_SSH_CONFIG"
CONNECT_TIMEOUT = 15.0
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_known_hosts_lock = threading.Lock()


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


_INVENTORY_KEYS = {"host", "board", "user", "port", "install_dir"}


def load_inventory(path: Path) -> list[Target]:
    """Targets from an inventory YAML file:

        defaults: {board: rpi5, user: pi}          # optional, for every host
        hosts:
          - pi@kitchen.local                       # USER@HOST[:PORT]
          - {host: 10.0.0.7, port: 2222, board: rpi4, install_dir: /opt/bmoe-edge}
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
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535):
            raise BmoeError(f"{where}: port {port!r} is not a number from 1 to 65535")
        for key in ("board", "install_dir", "user"):
            value = merged.get(key) if key != "user" else user
            if value is not None and not isinstance(value, str):
                raise BmoeError(f"{where}: {key} must be a string")
        install_dir = merged.get("install_dir")
        if install_dir is not None and not str(install_dir).startswith("/"):
            raise BmoeError(f"{where}: install_dir {install_dir!r} must be an absolute path")
        out.append(Target(target.host, user, port, merged.get("board"), install_dir))
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


class Board:
    """An SSH connection to one board (a fabric Connection with strict host keys), with helpers."""

    def __init__(self, target: Target, options: SshOptions | None = None, *,
                 default_user: str | None = None, default_port: int | None = None) -> None:
        from fabric import Config, Connection

        self.target = target
        self.options = options or SshOptions()
        path = self.options.config_path()
        if path is not None and not path.is_file():
            raise BmoeError(f"ssh config {path} does not exist")
        try:
            config = Config(runtime_ssh_path=str(path)) if path else Config()
        except Exception as exc:   # paramiko's config parser raises assorted errors
            raise BmoeError(f"ssh config {path or '~/.ssh/config'}: {exc}") from None
        config.runners.remote = _utf8_remote_class()
        lookup = config.base_ssh_config.lookup(target.host)
        user = target.user or (None if "user" in lookup else default_user)
        port = target.port or (None if "port" in lookup else default_port)
        self.conn = Connection(target.host, user=user, port=port, config=config,
                               connect_timeout=int(self.options.connect_timeout))
        host = f"[{target.host}]" if ":" in target.host else target.host
        self.label = f"{self.conn.user}@{host}:{self.conn.port}"
        files = lookup.get("userknownhostsfile", "~/.ssh/known_hosts").split()
        self.known_hosts = [Path(os.path.expanduser(f)) for f in files]
        strict = lookup.get("stricthostkeychecking", "yes").lower()
        accept_new = self.options.accept_new_host_key or strict in ("accept-new", "no", "off")
        client = self.conn.client
        for f in self.known_hosts:
            if f.is_file():
                try:
                    client.load_host_keys(str(f))
                except Exception as exc:   # a malformed line
                    raise BmoeError(f"known hosts file {f}: {exc}") from None
        system = Path("/etc/ssh/ssh_known_hosts")
        if system.is_file():
            with contextlib.suppress(Exception):
                client.load_system_host_keys(str(system))
        client.set_missing_host_key_policy(_HostKeyPolicy(accept_new, self.known_hosts[0]))
        self.opened = False

    # -- connection ---------------------------------------------------------------------------------

    def accept_command(self) -> str:
        port = self.conn.port
        keyscan = f"ssh-keyscan{f' -p {port}' if port != 22 else ''} {shlex.quote(self.conn.host)}"
        return f"{keyscan} >> {_shell_path(self.known_hosts[0])}"

    def open(self) -> Board:
        import paramiko

        where = f"{self.conn.user}@{self.conn.host}:{self.conn.port}"
        try:
            self.conn.open()
        except UnknownHostKey as exc:
            raise BmoeError(
                f"{self.label}: unknown host key ({exc.key_type} {exc.fingerprint}, not in "
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
        return self

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    def __enter__(self) -> Board:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def errors(self, what: str) -> Iterator[None]:
        """A lost connection or SFTP failure mid-way becomes a one-line BmoeError naming the step."""
        import paramiko

        try:
            yield
        except BmoeError:
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise BmoeError(f"{self.label}: {what}: {_reason(exc)}") from None

    # -- commands -----------------------------------------------------------------------------------

    def run(self, command: str, *, what: str, check: bool = True, timeout: float | None = None,
            out: IO[str] | None = None, err: IO[str] | None = None) -> Any:
        """Run a shell command line on the board (its arguments already quoted); returns fabric's Result.

        With `out`/`err` the output is streamed there as it arrives (no pty), and still captured.
        """
        from invoke.exceptions import CommandTimedOut

        kwargs: dict[str, Any] = {"warn": True, "pty": False, "in_stream": False, "timeout": timeout}
        if out is None and err is None:
            kwargs["hide"] = True
        else:
            kwargs.update(out_stream=out or io.StringIO(), err_stream=err or io.StringIO(), hide=False)
        with self.errors(what):
            try:
                result = self.conn.run(command, **kwargs)
            except CommandTimedOut:
                raise BmoeError(f"{self.label}: {what}: timed out after {timeout:.0f} s") from None
        if check and result.exited != 0:
            why = tail(result.stderr or result.stdout)
            raise BmoeError(f"{self.label}: {what} failed (exit {result.exited}): {why}")
        return result

    def sh(self, script: str, *args: str, what: str, check: bool = True, timeout: float | None = None,
           out: IO[str] | None = None, err: IO[str] | None = None) -> Any:
        """`sh -c SCRIPT sh ARGS…`: the script is fixed text, the arguments are data ($1, $2, …)."""
        return self.run(sh_command(script, *args), what=what, check=check, timeout=timeout, out=out, err=err)

    def put(self, local: Path, remote: str) -> None:
        with self.errors(f"upload of {local.name} to {remote}"):
            self.conn.put(str(local), remote=remote, preserve_mode=True)

    def read_bytes(self, remote: str) -> bytes | None:
        """A file's content, or None when it does not exist."""
        sftp = self._sftp()
        with self.errors(f"reading {remote}"):
            try:
                with sftp.open(remote, "rb") as f:
                    return f.read()
            except FileNotFoundError:
                return None

    def write_bytes(self, remote: str, data: bytes, mode: int = 0o644) -> None:
        """Write a file atomically (a temporary name, then rename over the target)."""
        sftp = self._sftp()
        tmp = f"{remote}.tmp.{os.getpid()}.{threading.get_ident()}"
        with self.errors(f"writing {remote}"):
            try:
                sftp.putfo(io.BytesIO(data), tmp)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, remote)
            except BaseException:
                with contextlib.suppress(Exception):
                    sftp.remove(tmp)
                raise

    def _sftp(self) -> Any:
        with self.errors("opening SFTP"):
            return self.conn.sftp()


def sh_command(script: str, *args: str) -> str:
    return " ".join(["sh", "-c", shlex.quote(script), "sh", *(shlex.quote(a) for a in args)])


def env_command(env: Mapping[str, str], argv: Sequence[str]) -> str:
    """`env K=V … ARGV…`, every word quoted (the remote login shell only sees literals)."""
    words = ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else list(argv)
    return " ".join(shlex.quote(w) for w in words)


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"timed out ({text})"
    return text


def tail(text: str, n: int = 1) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"


@functools.cache
def _utf8_remote_class() -> type:
    from fabric.runners import Remote

    class Utf8Remote(Remote):
        """fabric's Remote runner, decoding each stream incrementally: a UTF-8 character split across
        two reads (a token's text streamed from the board) is not turned into U+FFFD."""

        def read_proc_output(self, reader: Callable[[int], bytes]) -> Iterator[str]:
            decoder = codecs.getincrementaldecoder(self.encoding or "utf-8")("replace")
            while True:
                data = reader(self.read_chunk_size)
                if not data:
                    break
                text = decoder.decode(data)
                if text:
                    yield text
            rest = decoder.decode(b"", final=True)
            if rest:
                yield rest

    return Utf8Remote
