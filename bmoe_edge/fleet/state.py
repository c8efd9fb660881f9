"""An install dir on a board: its layout, its releases, state.json, the pointer file, and connecting
to a board with the install dir worked out (--install-dir, the inventory, the profile, the pointer)."""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bmoe_edge.boards import bundle
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.commands import Board, tail
from bmoe_edge.fleet.remote import SshOptions
from bmoe_edge.fleet.scripts import CONFIG_HOME, PREPARE
from bmoe_edge.fleet.targets import Target, check_name

Hooks = Mapping[str, Callable[[str], None]]


STAMP = ".bmoe-release.json"
STATE = "state.json"
LOCK = ".lock"
POINTER = "bmoe-edge/deploy.json"
UNIT_TEMPLATE = "launcher/bmoe-edge-generate@.service"
UNIT_NAME = "bmoe-edge-generate@.service"
KEEP = 5
GATES_TIMEOUT = 3 * 3600.0
INSTALL_TIMEOUT = 1800.0
VERSION_TIMEOUT = 600.0
HEALTH_TIMEOUT = 300.0
SITE_FACTOR = 4          # unpacked wheels take up to ~4x their size (site/): free-space estimate
FAILED = ".bmoe-failed"  # a release whose health check failed after its switch: never rolled back to
MARKS = (STAMP, FAILED)  # the deploy's own files in a release (not in the bundle)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------------
# Remote paths: everything under the install dir, bundle paths checked to stay inside the release.


@dataclass(frozen=True)
class Layout:
    install_dir: str

    def __post_init__(self) -> None:
        d = self.install_dir
        if not d.startswith("/") or "\0" in d or "\n" in d:
            raise BmoeError(f"install dir {d!r} must be an absolute path (no newline)")
        object.__setattr__(self, "install_dir", posixpath.normpath(d))

    @property
    def releases(self) -> str:
        return f"{self.install_dir}/releases"

    def release(self, bundle_id: str) -> str:
        return f"{self.releases}/{check_name(bundle_id, 'bundle id')}"

    def partial(self, bundle_id: str) -> str:
        return f"{self.releases}/.{check_name(bundle_id, 'bundle id')}.partial"

    @property
    def current(self) -> str:
        return f"{self.install_dir}/current"

    @property
    def state(self) -> str:
        return f"{self.install_dir}/{STATE}"

    @property
    def lock(self) -> str:
        return f"{self.install_dir}/{LOCK}"


def inside(base: str, rel: str) -> str:
    """`base/rel` for a bundle path that must stay inside base (no absolute path, no `..`)."""
    return f"{base}/{bundle.check_relpath(rel)}"


def release_name(link: str) -> str | None:
    """`releases/<id>` (what `current` holds) -> id; anything else -> None."""
    m = re.fullmatch(r"(?:\./)?releases/([^/]+)/?", link.strip())
    if not m:
        return None
    try:
        return check_name(m[1], "release")
    except BmoeError:
        return None


# ---------------------------------------------------------------------------------------------------
# One release on the board.


@dataclass
class Releases:
    """What `releases/` holds: complete releases (with their stamps), partials, the current link."""

    avail_kb: int | None
    current: str | None                  # id of the release `current` points at
    current_link: str                    # what `current` holds (readlink)
    complete: dict[str, dict[str, Any]]  # id -> stamp
    others: list[str]                    # partials and stray directories
    failed: set[str] = field(default_factory=set)   # complete releases marked failed (never rolled back to)

    def newest_first(self) -> list[str]:
        """Complete release ids, the most recently installed first."""
        return sorted(self.complete, key=lambda r: str(self.complete[r].get("installed_at", "")), reverse=True)

    def good_newest_first(self) -> list[str]:
        """Complete releases not marked failed, the most recently installed first."""
        return [r for r in self.newest_first() if r not in self.failed]


def list_releases(board: Board, layout: Layout, *, create: bool) -> Releases:
    result = board.sh(PREPARE, layout.install_dir, "create" if create else "read",
                      what=f"reading {layout.install_dir}", check=False)
    if result.exited in (10, 11):
        raise BmoeError(f"{board.label}: install dir {layout.install_dir} is not writable: "
                        f"{tail(result.stderr)}")
    if result.exited != 0:
        raise BmoeError(f"{board.label}: reading {layout.install_dir} failed: {tail(result.stderr)}")
    avail, link, complete, others, failed = None, "", {}, [], set()
    for line in result.stdout.splitlines():
        if line.startswith("avail_kb="):
            avail = int(line[9:]) if line[9:].isdigit() else None
        elif line.startswith("current="):
            link = line[8:]
        elif line.startswith("release "):
            _, name, stamp_text = [*line.split(" ", 2), ""][:3]
            try:
                stamp = json.loads(stamp_text)
                check_name(name, "release")
            except (ValueError, BmoeError):
                continue
            if isinstance(stamp, dict) and stamp.get("bundle_id") == name:
                complete[name] = stamp
        elif line.startswith("failed "):
            failed.add(line[7:])
        elif line.startswith(("other ", "symlink ")):
            others.append(line.split(" ", 1)[1])
    return Releases(avail, release_name(link), link, complete, others, failed & set(complete))


def write_pointer(board: Board, data: dict[str, Any]) -> None:
    home = board.sh(CONFIG_HOME, what="finding ~/.config").stdout.strip()
    if not home.startswith("/"):
        return
    board.sh("mkdir -p -- \"$1\"", f"{home}/bmoe-edge", what="creating ~/.config/bmoe-edge")
    board.write_bytes(f"{home}/{POINTER}", (json.dumps(data) + "\n").encode())


def read_pointer(board: Board) -> dict[str, Any] | None:
    home = board.sh(CONFIG_HOME, what="finding ~/.config").stdout.strip()
    if not home.startswith("/"):
        return None
    raw = board.read_bytes(f"{home}/{POINTER}")
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def read_state(board: Board, layout: Layout) -> dict[str, Any]:
    raw = board.read_bytes(layout.state)
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def write_state(board: Board, layout: Layout, state: Mapping[str, Any]) -> None:
    board.write_bytes(layout.state, (json.dumps(state, indent=2) + "\n").encode())


def read_gates(state: dict[str, Any], bundle_id: str) -> dict[str, Any] | None:
    releases = state.get("releases")
    if isinstance(releases, dict) and isinstance(releases.get(bundle_id), dict):
        gates = releases[bundle_id].get("gates")
        return gates if isinstance(gates, dict) else None
    return None


# ---------------------------------------------------------------------------------------------------
# Rollback and status.


def layout_for(board: Board, target: Target, install_dir: str | None, profile_dir: str | None) -> Layout:
    chosen = install_dir or target.install_dir or profile_dir
    if not chosen:
        pointer = read_pointer(board)
        chosen = str(pointer.get("install_dir", "")) if pointer else ""
    if not chosen:
        raise BmoeError(f"{board.label}: no deploy found there (no ~/.config/{POINTER}); pass --install-dir or "
                        "--board")
    return Layout(chosen)


def profile_ssh(board_name: str | None) -> dict[str, Any]:
    if not board_name:
        return {}
    from bmoe_edge.boards import profiles

    ssh = profiles.load_profile(board_name).ssh
    return {"user": ssh.user, "port": ssh.port, "install_dir": ssh.install_dir}


def connect(target: Target, options: SshOptions, board_name: str | None = None,
            install_dir: str | None = None) -> tuple[Board, Layout]:
    """An open connection to the board and where its deploys live."""
    defaults = profile_ssh(target.board or board_name)
    board = Board(target, options, default_user=defaults.get("user"), default_port=defaults.get("port"))
    board.open()
    try:
        return board, layout_for(board, target, install_dir, defaults.get("install_dir"))
    except BaseException:
        board.close()
        raise


@dataclass
class Install:
    """An open connection to a board and what its install dir holds."""

    board: Board
    layout: Layout
    releases: Releases
    state: dict[str, Any]


@contextlib.contextmanager
def opened(target: Target, options: SshOptions, board_name: str | None = None,
           install_dir: str | None = None) -> Iterator[Install]:
    """Connect, find the install dir, read its releases and state.json; closes the connection after."""
    board, layout = connect(target, options, board_name, install_dir)
    with board:
        yield Install(board, layout, list_releases(board, layout, create=False), read_state(board, layout))


def current_release(board: Board, layout: Layout) -> tuple[str, str, bundle.Manifest]:
    """(release id, release dir, its manifest) of what `current` points at, resolved once."""
    link = board.sh('readlink -- "$1" || true', layout.current, what="reading current").stdout.strip()
    rid = release_name(link)
    if rid is None:
        raise BmoeError(f"{board.label}: nothing is deployed in {layout.install_dir}"
                        + (f" (`current` is {link!r})" if link else "") + ": run `bmoe-edge deploy` first")
    rel = layout.release(rid)
    _, manifest = release_manifest(board, rel, "deploy again")
    return rid, rel, manifest


def release_manifest(board: Board, rel: str, remedy: str) -> tuple[bytes, bundle.Manifest]:
    """A release's manifest on the board: its raw bytes (for the sha256) and the parsed form."""
    raw = board.read_bytes(f"{rel}/{bundle.MANIFEST_NAME}")
    if raw is None:
        raise BmoeError(f"{board.label}: {rel}/manifest.json is missing: {remedy}")
    try:
        return raw, bundle.manifest_from_dict(json.loads(raw), f"{rel}/manifest.json")
    except ValueError as exc:
        raise BmoeError(f"{board.label}: {rel}/manifest.json is not valid JSON: {exc}") from None


def release_env(rel: str) -> dict[str, str]:
    return {"BMOE_EDGE_RELEASE": rel, "BMOE_EDGE_PROFILES": f"{rel}/{bundle.PROFILE_DIR}"}
