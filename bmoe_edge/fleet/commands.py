"""Commands on a board over its SSH connection (channel.py): fixed scripts run as `sh -s` with
`set -- ARGS…` (each quoted with `shlex.quote`) on stdin, so paths and prompts are data, never shell
code, and the login shell never parses them; files travel over exec channels too (no SFTP). Every
command has a deadline; a failed step is one BmoeError naming the host, with its stderr."""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import channel
from bmoe_edge.fleet.channel import Result
from bmoe_edge.fleet.remote import BoardConnection, reason
from bmoe_edge.fleet.scripts import READ, REQUEST, REQUEST_DIR, UNTAR, WRITE

STEP_TIMEOUT = 600.0      # default deadline of one remote step
MIN_RATE = 256 * 1024     # bytes/s an upload is allowed before its deadline (plus STEP_TIMEOUT)


class Board(BoardConnection):
    """A board to run commands on: its SSH connection (BoardConnection) and the steps over it."""

    _request_dir: str | None = None   # the board's request directory, once created (request_dir)

    def execute(self, command: str, *, what: str, stdin: channel.Data | None = None, keep_stdin: bool = False,
                check: bool = True, timeout: float | None = STEP_TIMEOUT, out: IO[str] | None = None,
                err: IO[str] | None = None) -> Result:
        """One command line on the board (fixed words only: the login shell parses it), with a deadline."""
        import paramiko  # host-only (the host extra), like fabric

        try:
            result = channel.execute(self.transport(), command, stdin=stdin, keep_stdin=keep_stdin,
                                     timeout=timeout, out=out, err=err)
        except TimeoutError:   # the step's deadline, or a send that made no progress for 60 s
            after = f" after {timeout:.0f} s" if timeout is not None else ""
            raise BmoeError(f"{self.label}: {what}: timed out{after}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            why = "the board stopped answering (no keepalive reply)" if self._dead() else reason(exc)
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

    def put_files(self, root: Path, paths: Sequence[str], remote_dir: str) -> None:
        """Upload the files `paths` (relative to `root`, modes kept) into `remote_dir` as one tar stream
        over one exec channel: a board answers each channel in ~0.1-0.3 s, so a bundle of 35 files
        costs one round trip instead of 70. The caller checks every file's sha256 afterwards."""
        with tempfile.TemporaryDirectory(prefix="bmoe-upload-") as tmp:
            stream = Path(tmp) / "files.tar"
            with tarfile.open(stream, "w", format=tarfile.PAX_FORMAT) as tar:
                for p in paths:
                    tar.add(root / p, arcname=p, recursive=False, filter=_without_owner)
            size = stream.stat().st_size
            self.sh(UNTAR, remote_dir, what=f"upload of {len(paths)} files to {remote_dir}", data=stream,
                    timeout=STEP_TIMEOUT + size / MIN_RATE)

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


def _without_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def env_argv(env: Mapping[str, str], argv: Sequence[str]) -> list[str]:
    """`env K=V… sh -c 'exec "$0" "$@"' ARGV…`: env takes every leading word with a `=` for one more
    variable, so `env K=V /opt/a=b/launcher gates` would run `gates` from PATH; it stops at `sh`
    instead, and the program's path reaches exec as data."""
    return ["env", *(f"{k}={v}" for k, v in env.items()), "sh", "-c", 'exec "$0" "$@"', *argv]


def tail(text: str, n: int = 1) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) if lines else "(no output)"
