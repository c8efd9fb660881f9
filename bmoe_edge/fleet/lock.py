"""The board lock: one deploy, rollback or state write at a time on an install dir.

Held for the whole of a deploy (from reading `releases/` and `current` to the last state write) by one
long-lived remote command (sh/lock.sh): `flock` on `<install_dir>/.lock` where the board has flock(1),
else a lock directory `<install_dir>/.lock.d` with the holder's pid. The command ends — and the kernel
or its trap releases the lock — when the client lets go or its connection goes away (a killed deploy
never leaves a board locked). A second deploy prints who holds it and waits up to `--lock-timeout`
seconds, then fails with one line. The holder sends a heartbeat line every 15 s; a board that hears none
for 60 s lets the lock go (a client that vanished without closing its connection).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import channel
from bmoe_edge.fleet.commands import Board, tail
from bmoe_edge.fleet.scripts import LOCK

LOCK_TIMEOUT = 900.0
HEARTBEAT = 15.0    # s between the holder's heartbeat lines
SILENCE = 60        # s without one after which the board takes the holder for gone
BUSY = 75
NOT_WRITABLE = 10


def owner_line(action: str) -> str:
    with contextlib.suppress(Exception):
        return f"{action} by {getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()}) since " \
               f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    return f"{action} (pid {os.getpid()})"


def _read_until_locked(chan: Any, board: Board, install_dir: str, wait: float, say: Any) -> None:
    deadline = channel.Deadline(wait + 60.0)
    buf = b""
    err = b""
    chan.settimeout(0.0)
    chan.fileno()
    while True:
        while chan.recv_ready():
            buf += chan.recv(4096)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(4096)
        while b"\n" in buf:
            line, _, buf = buf.partition(b"\n")
            text = line.decode("utf-8", "replace")
            if text == "locked":
                return
            if text.startswith("waiting"):
                holder = text[8:].strip() or "another deploy"
                say(f"waiting up to {wait:.0f} s for the board lock of {install_dir} (held: {holder})")
            elif text.startswith("busy"):
                holder = text[5:].strip() or "another deploy"
                raise BmoeError(f"{board.label}: {install_dir} is locked by another run ({holder}); waited "
                                f"{wait:.0f} s: try again when it is done, or raise --lock-timeout")
        if chan.closed or (chan.eof_received and chan.exit_status_ready() and not chan.recv_ready()):
            code = chan.recv_exit_status() if chan.exit_status_ready() else -1
            why = tail(err.decode("utf-8", "replace"))
            if code == NOT_WRITABLE:
                raise BmoeError(f"{board.label}: install dir {install_dir} is not writable: {why}")
            raise BmoeError(f"{board.label}: taking the board lock of {install_dir} failed (exit {code}): {why}")
        if deadline.passed():
            raise BmoeError(f"{board.label}: taking the board lock of {install_dir}: no answer in "
                            f"{deadline.seconds:.0f} s")
        select.select([chan], [], [], 1.0)


def _heartbeat(chan: Any, stop: threading.Event) -> None:
    """One line every HEARTBEAT s on the lock's stdin: the board lets go of a holder it has not heard
    from in SILENCE s (sh/lock.sh), so a client gone without a FIN does not keep the board locked."""
    while not stop.wait(HEARTBEAT):
        try:
            chan.sendall(b"\n")
        except Exception:   # the channel is gone: the lock went with it
            return


@contextlib.contextmanager
def board_lock(board: Board, install_dir: str, *, action: str, wait: float = LOCK_TIMEOUT,
               say: Any = None, mode: str = "auto") -> Iterator[None]:
    """Hold the install dir's lock for the block (`mode` "dir": the lock directory even where flock
    exists — what a board without flock(1) uses)."""
    import paramiko

    say = say or (lambda _m: None)
    script = channel.frame(LOCK, [install_dir, str(int(wait)), owner_line(action), mode, str(SILENCE)],
                           keep_stdin=True)
    try:
        chan = board.transport().open_session(timeout=channel.OPEN_TIMEOUT)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise BmoeError(f"{board.label}: taking the board lock of {install_dir}: {exc}") from None
    try:
        try:
            chan.exec_command("sh -s")
            chan.sendall(script.encode())
            _read_until_locked(chan, board, install_dir, wait, say)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise BmoeError(f"{board.label}: taking the board lock of {install_dir}: {exc}") from None
        beating = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(chan, beating), daemon=True, name="board-lock-heartbeat")
        beat.start()
        try:
            yield
        finally:
            beating.set()
            beat.join(timeout=5.0)
    finally:
        with contextlib.suppress(Exception):
            chan.shutdown_write()      # the holder's `cat` ends: the lock is released
            chan.status_event.wait(5.0)
        with contextlib.suppress(Exception):
            chan.close()
