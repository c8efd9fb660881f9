"""The emulated board: a real OpenSSH `sshd` on 127.0.0.1 in front of this machine (the qemu-arm64 profile).

The `qemu-arm64` board is this machine running the bundle's aarch64 Python under `qemu-aarch64` (its
launcher calls qemu explicitly; binfmt_misc is never used). To deploy to it the way one deploys to a
Raspberry Pi, it needs an SSH server: this module starts one per board, with throwaway keys, on a
free loopback port, so `deploy`, `status`, `gates --host` and `generate --host` talk real SSH to it.
The tests and `scripts/demo.sh` use it.

A *lab* directory holds what every client needs and one directory per board:

    <lab>/ssh/id_ed25519, id_ed25519.pub   the user key (authorized for every board of the lab)
    <lab>/ssh/authorized_keys
    <lab>/ssh/known_hosts                  [127.0.0.1]:PORT <host key> of each started board
    <lab>/ssh_config                       for clients: IdentityFile + UserKnownHostsFile (pass it with
                                           --ssh-config or $BMOE_EDGE_SSH_CONFIG; ~/.ssh is not touched)
    <lab>/boards/<name>/                   sshd_config, ssh_host_ed25519_key, sshd.log, board.json (pid, port)
    <lab>/boards/<name>/home/              the board's sessions' $HOME (their login shell's rc files),
                                           .config and .cache ($XDG_CONFIG_HOME, $XDG_CACHE_HOME)

sshd runs as the current user (root here: `/run/sshd` must exist, it is created when missing), with
`StrictModes yes` (the lab's authorized key is read by `AuthorizedKeysCommand /usr/bin/cat …`, so the
lab may live under /tmp; its directories must be private, 0700, and the current user's), no passwords,
no PAM. `read_only=[dirs]` starts it in a private mount namespace
(`unshare --mount`) where those directories are bind-mounted read-only: a board whose install dir
cannot be written, without changing anything outside that namespace (needs root / CAP_SYS_ADMIN).

    python -m bmoe_edge.fleet.emulated_board start --lab DIR [--name board] [--port N]   # prints USER@HOST:PORT
    python -m bmoe_edge.fleet.emulated_board stop --lab DIR [--name board]
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.errors import BmoeError

SSHD = "/usr/sbin/sshd"
CAT = "/usr/bin/cat"
HOST = "127.0.0.1"
STATE = "board.json"


@dataclass(frozen=True)
class EmulatedBoard:
    name: str
    lab: Path
    port: int
    pid: int
    user: str

    @property
    def dir(self) -> Path:
        return board_dir(self.lab, self.name)

    @property
    def target(self) -> str:
        """What `--host` takes: USER@127.0.0.1:PORT."""
        return f"{self.user}@{HOST}:{self.port}"

    @property
    def ssh_config(self) -> Path:
        return self.lab / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.lab / "ssh" / "known_hosts"

    @property
    def identity(self) -> Path:
        return self.lab / "ssh" / "id_ed25519"

    @property
    def install_dir(self) -> Path:
        """A per-board install dir (boards of one lab share this machine's filesystem)."""
        return self.dir / "install"

    @property
    def home(self) -> Path:
        return self.dir / "home"

    def alive(self) -> bool:
        return _is_our_sshd(self.pid, self.dir / "sshd_config")

    def host_key_line(self) -> str:
        key = (self.dir / "ssh_host_ed25519_key.pub").read_text().split()
        return f"[{HOST}]:{self.port} {key[0]} {key[1]}\n"


def board_dir(lab: Path, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise BmoeError(f"emulated board name {name!r} is not a plain name")
    return Path(lab).absolute() / "boards" / name


def _keygen(path: Path, comment: str) -> None:
    if path.is_file() and path.with_suffix(".pub").is_file():
        return
    if shutil.which("ssh-keygen") is None:
        raise BmoeError("ssh-keygen not found (the emulated board needs it): apt-get install openssh-client")
    path.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)


def _private_dir(path: Path) -> None:
    """Create `path` (0700) or check an existing one is ours and private: keys are never taken from a
    directory someone else could have written."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise BmoeError(f"lab directory {path} is not a private directory of yours (0700): use a fresh --lab")


def _prepare_lab(lab: Path) -> None:
    ssh = lab / "ssh"
    _private_dir(lab)
    _private_dir(ssh)
    _keygen(ssh / "id_ed25519", "bmoe-edge emulated board user")
    pub = (ssh / "id_ed25519.pub").read_text()
    if not (ssh / "authorized_keys").is_file() or (ssh / "authorized_keys").read_text() != pub:
        (ssh / "authorized_keys").write_text(pub)
    (ssh / "known_hosts").touch()
    (lab / "ssh_config").write_text(
        "# Written by bmoe_edge.fleet.emulated_board: how clients reach the emulated boards of this lab.\n"
        f"Host {HOST} localhost\n"
        f"  IdentityFile {ssh / 'id_ed25519'}\n"
        f"  UserKnownHostsFile {ssh / 'known_hosts'}\n"
        "  IdentitiesOnly yes\n"
        "  StrictHostKeyChecking yes\n"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _is_our_sshd(pid: int, config: Path) -> bool:
    # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -f CONFIG -e [listener] ..."): match the bytes
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"sshd" in cmdline and str(config).encode() in cmdline


def _write_known_host(board: EmulatedBoard) -> None:
    path = board.known_hosts
    prefix = f"[{HOST}]:{board.port} "
    lines = [ln for ln in path.read_text().splitlines(keepends=True) if not ln.startswith(prefix)]
    path.write_text("".join(lines) + board.host_key_line())


def running(lab: Path, name: str = "board") -> EmulatedBoard | None:
    """The board started earlier (by this or another process), if its sshd still runs."""
    state = board_dir(lab, name) / STATE
    try:
        data = json.loads(state.read_text())
        board = EmulatedBoard(name, Path(lab).absolute(), int(data["port"]), int(data["pid"]), str(data["user"]))
    except (OSError, ValueError, KeyError):
        return None
    return board if board.alive() else None


def start(lab: Path, name: str = "board", *, port: int | None = None, read_only: Sequence[Path] = (),
          known: bool = True, sftp: bool = True, timeout: float = 15.0) -> EmulatedBoard:
    """Start (or reuse, when already running with the same settings) the sshd of board `name`.

    `known=False` leaves its host key out of the lab's known_hosts (an unknown host to clients);
    `sftp=False` gives it no SFTP subsystem (like a Dropbear-based image).
    """
    lab = Path(lab).absolute()
    if not Path(SSHD).is_file():
        raise BmoeError(f"{SSHD} not found (the emulated board is a real sshd): apt-get install openssh-server")
    existing = running(lab, name)
    if existing is not None and (port is None or existing.port == port) and not read_only and sftp:
        if known:
            _write_known_host(existing)
        return existing
    if existing is not None:
        stop(lab, name)
    _prepare_lab(lab)
    bdir = board_dir(lab, name)
    _private_dir(bdir.parent)
    _private_dir(bdir)
    (bdir / "home" / ".config").mkdir(parents=True, exist_ok=True)
    _keygen(bdir / "ssh_host_ed25519_key", f"bmoe-edge emulated board {name}")
    try:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # sshd's privilege-separation directory
    except OSError as exc:
        raise BmoeError(f"/run/sshd is missing and cannot be created ({exc.strerror}): run as root, or "
                        "`sudo mkdir -p /run/sshd`") from None
    user = getpass.getuser()
    last_error = ""
    for _attempt in range(5):
        chosen = port or _free_port()
        config = bdir / "sshd_config"
        config.write_text(
            "# Written by bmoe_edge.fleet.emulated_board: the emulated board's sshd (loopback only).\n"
            f"Port {chosen}\nListenAddress {HOST}\n"
            f"HostKey {bdir / 'ssh_host_ed25519_key'}\nPidFile {bdir / 'sshd.pid'}\n"
            # the lab's key, read by a root-owned command: StrictModes stays on, the lab may live under /tmp
            f"AuthorizedKeysFile none\nAuthorizedKeysCommand {CAT} {lab / 'ssh' / 'authorized_keys'}\n"
            f"AuthorizedKeysCommandUser {user}\n"
            "StrictModes yes\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUsePAM no\nUseDNS no\n"
            "PrintMotd no\nPrintLastLog no\nMaxStartups 64\nMaxSessions 64\n"
            + ("Subsystem sftp internal-sftp\n" if sftp else "")
            + "ClientAliveInterval 15\nClientAliveCountMax 3\n"
            # the board's own home: the login shell reads the board's (empty) rc files, not this machine's
            # (a developer's ~/.bashrc that runs `pyenv init` costs ~0.3 s per command and changes PATH)
            f"SetEnv HOME={bdir / 'home'} XDG_CONFIG_HOME={bdir / 'home' / '.config'} "
            f"XDG_CACHE_HOME={bdir / 'home' / '.cache'}\n"
            "LogLevel INFO\n"
        )
        argv = [SSHD, "-D", "-f", str(config), "-e"]
        if read_only:
            if shutil.which("unshare") is None:
                raise BmoeError("read-only install dirs need `unshare` (util-linux)")
            script = ('sshd=$1; cfg=$2; shift 2; for d; do mount --bind "$d" "$d" && '
                      'mount -o remount,bind,ro "$d" || exit 97; done; exec "$sshd" -D -f "$cfg" -e')
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                    SSHD, str(config), *(str(Path(d).absolute()) for d in read_only)]
        log = open(bdir / "sshd.log", "ab")  # noqa: SIM115 - handed to the daemon
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                with socket.create_connection((HOST, chosen), timeout=0.5) as s:
                    s.settimeout(2)
                    if s.recv(4).startswith(b"SSH-"):
                        board = EmulatedBoard(name, lab, chosen, proc.pid, user)
                        (bdir / STATE).write_text(json.dumps({"pid": proc.pid, "port": chosen, "user": user}) + "\n")
                        if known:
                            _write_known_host(board)
                        return board
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(5)
        last_error = _log_tail(bdir / "sshd.log")
        if proc.returncode == 97:
            raise BmoeError(f"emulated board {name}: cannot bind-mount {', '.join(map(str, read_only))} read-only "
                            f"(needs root / CAP_SYS_ADMIN): {last_error}")
        if port is not None or "Address already in use" not in last_error:
            break
    raise BmoeError(f"emulated board {name}: sshd did not start: {last_error}")


def _log_tail(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(no log)"


def stop(lab: Path, name: str = "board", timeout: float = 10.0) -> bool:
    """Stop the board's sshd (only if the recorded pid is that sshd); True when one was running."""
    bdir = board_dir(lab, name)
    try:
        data = json.loads((bdir / STATE).read_text())
        pid = int(data["pid"])
    except (OSError, ValueError, KeyError):
        return False
    (bdir / STATE).unlink(missing_ok=True)
    if not _is_our_sshd(pid, bdir / "sshd_config"):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _is_our_sshd(pid, bdir / "sshd_config"):
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bmoe_edge.fleet.emulated_board",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--lab", type=Path, required=True, help="the lab directory (keys, known_hosts, boards)")
    parser.add_argument("--name", default="board")
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            print(start(args.lab, args.name, port=args.port).target)
        elif args.action == "stop":
            stop(args.lab, args.name)
        else:
            board = running(args.lab, args.name)
            print(board.target if board else "stopped")
            return 0 if board else 1
    except BmoeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
