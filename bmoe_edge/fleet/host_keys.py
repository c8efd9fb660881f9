"""Host keys, strictly: fabric's own default is to accept any key; here an unknown host is refused with
the command that accepts it (or, with accept-new, its key added to the known_hosts file), a changed key
is always refused, and `@cert-authority`/`@revoked` lines are refused with a message (paramiko would read
them as plain keys). The same policy holds on the board and on every ProxyJump hop (remote.py)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shlex
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bmoe_edge.errors import BmoeError

_known_hosts_lock = threading.Lock()


class UnknownHostKey(Exception):
    def __init__(self, name: str, key_type: str, fingerprint: str) -> None:
        super().__init__(name)
        self.name, self.key_type, self.fingerprint = name, key_type, fingerprint


class HostKeyPolicy:
    """paramiko MissingHostKeyPolicy: refuse unknown hosts, or add them (accept-new) to known_hosts."""

    def __init__(self, accept_new: bool, known_hosts: Path) -> None:
        self.accept_new = accept_new
        self.known_hosts = known_hosts

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
        if not self.accept_new:
            raise UnknownHostKey(hostname, key.get_name(), f"SHA256:{digest}")
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _known_hosts_lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(self.known_hosts, "a", encoding="utf-8") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _known_hosts_files(lookup: Mapping[str, Any]) -> list[Path]:
    files = str(lookup.get("userknownhostsfile", "~/.ssh/known_hosts")).split()
    return [Path(os.path.expanduser(f)) for f in files]


def strict(client: Any, lookup: Mapping[str, Any], accept_new: bool) -> list[Path]:
    """Host keys of an SSH client checked strictly: the known_hosts files (markers refused with a clear
    message), unknown keys refused (or recorded when `accept_new` or the ssh config's accept-new), changed
    keys always refused. Returns the known_hosts files (the first is where a new key goes)."""
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
    accept = accept_new or strict in ("accept-new", "no", "off")
    client.set_missing_host_key_policy(HostKeyPolicy(accept, known[0]))
    return known


def check_known_hosts(path: Path) -> None:
    """paramiko reads `@cert-authority` and `@revoked` lines as plain keys (a revoked key would be
    trusted): refuse such a file with what to do instead."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for n, line in enumerate(lines, 1):
        words = line.split()      # any whitespace: ssh and paramiko take a tab as a separator too
        word = words[0].lower() if words else ""
        if word in ("@cert-authority", "@revoked"):
            raise BmoeError(f"known hosts file {path}, line {n}: {word} lines are not supported by bmoe-edge's "
                            "SSH client (host certificates and revocations would be misread): list the boards' "
                            "host keys in a known_hosts file of their own (`UserKnownHostsFile` in the ssh "
                            "config for those hosts)")


def accept_command(host: str, port: int, known_hosts: Path) -> str:
    """The command that records a host's key in `known_hosts` (what an unknown-host error suggests)."""
    keyscan = f"ssh-keyscan{f' -p {port}' if port != 22 else ''} {shlex.quote(host)}"
    return f"{keyscan} >> {_shell_path(known_hosts)}"


def _shell_path(path: Path) -> str:
    """A path for a command to paste: ~/... when under the home directory and plain, else quoted."""
    home = str(Path.home())
    text = str(path)
    if text.startswith(home + "/") and shlex.quote(text[len(home) + 1:]) == text[len(home) + 1:]:
        return "~/" + text[len(home) + 1:]
    return shlex.quote(text)


def show_home(path: Path) -> str:
    home = str(Path.home())
    text = str(path)
    return "~" + text[len(home):] if text == home or text.startswith(home + "/") else text
