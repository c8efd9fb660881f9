"""Commands on a board over one SSH exec channel each, without the login shell reading anything but
`sh -s` (or `sh .cache/bmoe-edge/req/<hex>`), with a deadline per command and a liveness check per
connection.

- **Framing**: a script and its arguments travel on the channel's stdin as
  `{ set -- 'arg1' 'arg2' …; SCRIPT } </dev/null` (every argument quoted for sh by `shlex.quote`): the
  board's `sh` parses it, whatever the login shell is (fish, csh), arguments of any length (a 200 KB
  prompt) never become a command line, and nothing shows in `ps` but `sh -s`. The `</dev/null` keeps
  the script's commands off the rest of stdin; a `hangup` command keeps stdin open instead (it
  watches it to stop when the connection goes away).
- **Data on stdin** (file uploads, state files): the framed script is first saved as a private request
  file (`${XDG_CACHE_HOME:-~/.cache}/bmoe-edge/req/<hex>`, mode 0600, deleted by itself when it runs),
  then run as `sh <that path>` with the data on stdin.
  No SFTP subsystem is needed (Dropbear-based images have none).
- **Deadlines**: every command has one; at the deadline its channel is closed and the step fails with
  one line. A liveness probe (`keepalive@openssh.com`, like ServerAliveInterval/CountMax) closes the
  connection of a board that stopped answering, so nothing waits forever on a dead board.
"""

from __future__ import annotations

import codecs
import contextlib
import re
import secrets
import select
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bmoe_edge.errors import BmoeError

OPEN_TIMEOUT = 30.0
CHUNK = 256 * 1024
REQUEST_DIR = ".cache/bmoe-edge/req"      # relative to the login directory (where sshd starts commands)
_PLAIN = re.compile(r"^[A-Za-z0-9/._+-]+$")


@dataclass
class Result:
    """What a remote command did: its exit code (-1: no status, the connection went away) and output."""

    exited: int
    stdout: str
    stderr: str
    raw: bytes = b""        # stdout as bytes (file reads)


def frame(script: str, args: Sequence[str], *, keep_stdin: bool = False, prelude: str = "") -> str:
    """The text `sh -s` reads: the arguments set, then the script, as one compound command."""
    for a in args:
        if "\0" in a:
            raise BmoeError("an argument for the board contains a NUL byte: it cannot be passed")
    words = " ".join(shlex.quote(a) for a in args)
    return f"{{\n{prelude}set -- {words}\n{script.rstrip()}\n}}" + ("\n" if keep_stdin else " </dev/null\n")


def request_name() -> str:
    return secrets.token_hex(12)


def request_command(directory: str, name: str) -> str:
    """`sh DIR/NAME`: plain words any login shell reads alike (DIR is checked plain, NAME is hex)."""
    if not _PLAIN.match(directory) or not _PLAIN.match(name):
        raise BmoeError(f"request path {directory}/{name} is not plain")
    return f"sh {directory}/{name}"


def plain_dir(text: str) -> str:
    """The board's request directory when it is plain (an absolute path of plain characters), else the
    login-relative default."""
    text = text.strip()
    return text if text.startswith("/") and _PLAIN.match(text) and ".." not in text else REQUEST_DIR


class Deadline:
    """A monotonic deadline (None: none)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.at = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        return None if self.at is None else self.at - time.monotonic()

    def passed(self) -> bool:
        left = self.left()
        return left is not None and left <= 0


@dataclass(frozen=True)
class FileFrom:
    """A local file from a byte offset on (a resumed upload)."""

    path: Path
    offset: int = 0


Data = bytes | Path | FileFrom


def _send(chan: Any, data: Data, deadline: Deadline) -> None:
    def chunks() -> Any:
        if isinstance(data, bytes | bytearray):
            for i in range(0, len(data), CHUNK):
                yield data[i:i + CHUNK]
        else:
            source = data if isinstance(data, FileFrom) else FileFrom(data)
            with open(source.path, "rb") as f:
                f.seek(source.offset)
                while block := f.read(CHUNK):
                    yield block

    for block in chunks():
        left = deadline.left()
        if left is not None and left <= 0:
            raise TimeoutError("sending")
        chan.settimeout(60.0 if left is None else max(0.1, min(60.0, left)))
        chan.sendall(block)


def execute(transport: Any, command: str, *, stdin: Data | None = None, keep_stdin: bool = False,
            timeout: float | None = None, out: IO[str] | None = None, err: IO[str] | None = None) -> Result:
    """Run `command` in one exec channel: send stdin (then EOF, unless keep_stdin), collect (and stream)
    stdout/stderr until the command exits. TimeoutError at the deadline (the channel is closed: a
    hangup command stops on the board); ConnectionError when the connection goes away."""
    deadline = Deadline(timeout)
    chan = transport.open_session(timeout=OPEN_TIMEOUT)
    try:
        chan.exec_command(command)
        if stdin is not None:
            try:
                _send(chan, stdin, deadline)
            except OSError:
                if not (chan.closed or chan.exit_status_ready()):
                    raise          # else: the command ended early; its status and stderr say why
        if not keep_stdin and not chan.closed:
            chan.shutdown_write()
        chan.settimeout(0.0)
        outs: list[bytes] = []
        errs: list[bytes] = []
        decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in range(2)]
        sinks = (out, err)

        def take(i: int, data: bytes) -> None:
            (outs if i == 0 else errs).append(data)
            sink = sinks[i]
            if sink is not None:
                text = decoders[i].decode(data)
                if text:
                    sink.write(text)
                    sink.flush()

        chan.fileno()   # make the channel selectable (stdout and stderr data both wake it)
        while True:
            got = False
            while chan.recv_ready():
                take(0, chan.recv(CHUNK))
                got = True
            while chan.recv_stderr_ready():
                take(1, chan.recv_stderr(CHUNK))
                got = True
            if got:
                continue
            if chan.closed or (chan.eof_received and chan.exit_status_ready()):
                break
            left = deadline.left()
            if left is not None and left <= 0:
                raise TimeoutError(f"after {timeout:.0f} s")
            select.select([chan], [], [], 1.0 if left is None else max(0.01, min(1.0, left)))
        while chan.recv_ready():
            take(0, chan.recv(CHUNK))
        while chan.recv_stderr_ready():
            take(1, chan.recv_stderr(CHUNK))
        for i, sink in enumerate(sinks):
            rest = decoders[i].decode(b"", final=True)
            if sink is not None and rest:
                sink.write(rest)
                sink.flush()
        status = chan.recv_exit_status() if chan.exit_status_ready() else -1
        raw = b"".join(outs)
        if status == -1 and not transport.is_active():
            raise ConnectionError("the connection was lost")
        return Result(status, raw.decode("utf-8", "replace"), b"".join(errs).decode("utf-8", "replace"), raw)
    finally:
        chan.close()


class Liveness:
    """ServerAliveInterval/CountMax for a paramiko transport: every `interval` s a keepalive request
    that wants a reply; no reply within interval*count s -> `on_dead()` (which closes the connection)."""

    def __init__(self, transport: Any, interval: float, count: int, on_dead: Callable[[], None]) -> None:
        self.transport, self.interval, self.count, self.on_dead = transport, interval, count, on_dead
        self.stop = threading.Event()
        self.dead = False
        threading.Thread(target=self._loop, name="bmoe-keepalive", daemon=True).start()

    def _loop(self) -> None:
        while not self.stop.wait(self.interval):
            if not self.transport.is_active():
                return
            answered = threading.Event()
            threading.Thread(target=self._ask, args=(answered,), name="bmoe-keepalive-ask", daemon=True).start()
            if not answered.wait(self.interval * self.count) and not self.stop.is_set():
                self.dead = True
                self.on_dead()
                return

    def _ask(self, answered: threading.Event) -> None:
        with contextlib.suppress(Exception):   # a dying transport raises assorted errors
            self.transport.global_request("keepalive@openssh.com", wait=True)
        answered.set()
