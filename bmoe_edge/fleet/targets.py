"""Which boards a fleet command reaches: targets (`USER@HOST[:PORT]` strings), inventory YAML files
(hosts with their board names and optional user, port, install dir and role: `rpc-worker` boards lend
their memory to a main board's run, docs/rpc.md), and the plain names that become paths on a board."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.errors import BmoeError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


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
    import yaml  # a runtime dependency; imported when an inventory is read (the module stays light)

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
    if not _NAME.fullmatch(value or "") or ".." in value:     # fullmatch: `$` would let a trailing newline in
        raise BmoeError(f"{what} {value!r} is not a plain name (letters, digits, '.', '_', '+', '-')")
    return value
