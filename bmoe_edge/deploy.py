"""`bmoe-edge deploy`, `rollback`, `status`: releases on boards over SSH (fabric), safe to interrupt.

On the board (`<install_dir>`: `--install-dir`, else the inventory's, else the profile's `ssh.install_dir`):

    <install_dir>/releases/<bundle_id>/           a complete release: the bundle as built (manifest.json,
                                                  wheels/, launcher/, fixtures/) + site/ (the wheels
                                                  unpacked) + profile/<board>.yaml (the resolved profile)
                                                  + .bmoe-release.json (the completeness stamp)
    <install_dir>/releases/.<bundle_id>.partial/  an upload/install in progress: a re-run resumes it
    <install_dir>/current -> releases/<bundle_id>
    <install_dir>/state.json                      bundle id, board, deployed_at, previous, gate results
    <install_dir>/bin/bmoe-edge                   runs the current release (put it on PATH on the board)
    <install_dir>/systemd/bmoe-edge-generate@.service   the headless-generation unit, for this install dir
    ~/.config/bmoe-edge/deploy.json               where the last deploy went (status/gates/generate --host
                                                  find the install dir with it)

A deploy of one host, in order; each step is a one-line BmoeError naming the host when it fails:

1. connect (strict host keys) and **probe** the board: `uname -m`, glibc, and the board's Python run the
   way the launcher will run it — directly on a real board, through the profile's `exec_wrapper` on
   an emulated one (qemu-arm64: `qemu-aarch64 -cpu cortex-a76 -L <sysroot> <sysroot>/usr/bin/python3.11`
   asked for `platform.machine()`, so the emulated board reports aarch64 although its sshd runs on
   x86_64). Arch, Python and glibc are checked against the manifest **before anything is uploaded**;
2. check the install dir is writable and has room;
3. **upload** into `releases/.<id>.partial/`, skipping files already there with the right sha256 and
   copying (on the board) files that another release there already has: a no-change redeploy uploads
   nothing, a changed launcher uploads one small file;
4. **verify** every file's sha256 on the board (`sha256sum`), and that the release holds no symlink and
   no unlisted file;
5. **install**: `launcher/bmoe-edge.sh --install-site` (the wheels unpacked into site/, no pip, no
   network), under `flock` so an install left running by a killed deploy and a re-run never overlap;
   then the release must run (`bmoe-edge.sh --version` reports the bundle's arch and the hook);
6. stamp it complete and rename `.partial` to `releases/<id>` (the commit point of an upload);
7. with `--gates`: `gates --quick --json --fixtures <release>/fixtures` from the new release; any failing
   cell stops here, `current` unchanged;
8. verify again (nothing changed since step 4), then **switch** `current` atomically
   (`ln -sfn releases/<id> current.tmp && mv -T current.tmp current`), write state.json, bin/bmoe-edge,
   the systemd unit and the pointer file, and delete releases beyond `--keep` (never current or previous).

Killing the command at any point leaves `current` on a complete, verified release (the switch is one
rename), and running it again finishes the job.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bmoe_edge import __version__, bundle, remote
from bmoe_edge.errors import BmoeError
from bmoe_edge.remote import Board, SshOptions, Target

STAMP = ".bmoe-release.json"
STATE = "state.json"
PROFILE_DIR = "profile"
LOCK = ".lock"
POINTER = "bmoe-edge/deploy.json"
UNIT_TEMPLATE = "launcher/bmoe-edge-generate@.service"
UNIT_NAME = "bmoe-edge-generate@.service"
KEEP = 5
GATES_TIMEOUT = 3 * 3600.0
INSTALL_TIMEOUT = 1800.0
SITE_FACTOR = 4          # unpacked wheels take up to ~4x their size (site/): free-space estimate

Log = Callable[[str], None]
Hooks = Mapping[str, Callable[[str], None]]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


# ---------------------------------------------------------------------------------------------------
# Results.


@dataclass
class HostResult:
    host: str
    board: str | None = None
    ok: bool = False
    action: str = ""                  # deployed | redeployed | rolled back | status
    error: str | None = None
    install_dir: str | None = None
    bundle_id: str | None = None      # the current release afterwards
    previous: str | None = None
    files: int = 0
    files_present: int = 0            # already on the board with the right sha256
    files_copied: int = 0             # copied on the board from another release there
    files_uploaded: int = 0
    bytes_uploaded: int = 0
    gates: dict[str, Any] | None = None
    deployed_at: str | None = None
    releases: list[str] = field(default_factory=list)
    note: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        return f"{self.releases}/{remote.check_name(bundle_id, 'bundle id')}"

    def partial(self, bundle_id: str) -> str:
        return f"{self.releases}/.{remote.check_name(bundle_id, 'bundle id')}.partial"

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


def _release_name(link: str) -> str | None:
    """`releases/<id>` (what `current` holds) -> id; anything else -> None."""
    m = re.fullmatch(r"(?:\./)?releases/([^/]+)/?", link.strip())
    if not m:
        return None
    try:
        return remote.check_name(m[1], "release")
    except BmoeError:
        return None


# ---------------------------------------------------------------------------------------------------
# Board facts.


@dataclass(frozen=True)
class BoardFacts:
    uname: str         # `uname -m` of the machine behind the sshd
    arch: str          # what the bundle's programs see (emulated boards: platform.machine() under qemu)
    python: str        # the board Python's version, e.g. 3.11.2
    glibc: str         # e.g. 2.36
    emulated: bool
    via: str           # how `arch` was found


_PY_PROBE = ("import json, os, platform, sys; print('python=' + json.dumps({'machine': platform.machine(), "
             "'version': '%d.%d.%d' % sys.version_info[:3], 'glibc': os.confstr('CS_GNU_LIBC_VERSION') or ''}))")

# $1 sysroot default, $2 python (may contain {sysroot}), $3.. the exec wrapper (may contain {sysroot});
# $BMOE_EDGE_SYSROOT / $BMOE_EDGE_PYTHON override like in the launcher.
_PROBE = r"""
printf 'uname=%s\n' "$(uname -m)"
printf 'getconf=%s\n' "$(getconf GNU_LIBC_VERSION 2>/dev/null)"
sysroot=${BMOE_EDGE_SYSROOT:-$1}
sub() {
  case $1 in *'{sysroot}'*) printf '%s' "${1%%\{sysroot\}*}$sysroot${1#*\{sysroot\}}";; *) printf '%s' "$1";; esac
}
python=${BMOE_EDGE_PYTHON:-$(sub "$2")}
code=$3
shift 3
n=$#
for w in "$@"; do set -- "$@" "$(sub "$w")"; done
shift "$n"
if [ $# -gt 0 ] && ! command -v "$1" >/dev/null 2>&1; then printf 'missing=%s\n' "$1"; exit 0; fi
case $python in
  */*) [ -x "$python" ] || { printf 'missing=%s\n' "$python"; exit 0; } ;;
  *) command -v "$python" >/dev/null 2>&1 || { printf 'missing=%s\n' "$python"; exit 0; } ;;
esac
"$@" "$python" -c "$code" 2>&1
printf 'python_rc=%s\n' "$?"
"""


def _norm_arch(machine: str) -> str:
    m = machine.strip().lower()
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(m, m)


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def probe(board: Board, manifest: bundle.Manifest) -> BoardFacts:
    """Ask the board what it is, the way the bundle's launcher will run there."""
    profile = manifest.profile
    wrapper = [str(w) for w in (profile.get("exec_wrapper") or [])]
    emulated = bool(wrapper)
    sysroot_default = ""
    if emulated:
        extra = manifest.extra.get("sysroot")
        sysroot_default = str(extra.get("path", "")) if isinstance(extra, dict) else ""
        python = "{sysroot}/usr/bin/python" + manifest.python
    else:
        python = "python" + manifest.python
    result = board.sh(_PROBE, sysroot_default, python, _PY_PROBE, *wrapper, what="probing the board")
    facts: dict[str, str] = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("uname", "getconf", "missing", "python", "python_rc"):
            facts[key] = value.strip()
    uname = _norm_arch(facts.get("uname", ""))
    if not emulated and uname and uname != manifest.arch and ("missing" in facts or "python" not in facts):
        raise BmoeError(f"{board.label}: the board is {uname} (uname -m), bundle {manifest.bundle_id} is for "
                        f"{manifest.arch}: build for this board (`bmoe-edge build --board NAME`)")
    if "missing" in facts:
        what = facts["missing"]
        if emulated and what == wrapper[0]:
            raise BmoeError(f"{board.label}: {what} not found on the board (the emulated board runs the bundle "
                            f"through `{' '.join(wrapper)}`): apt-get install qemu-user")
        if emulated:
            raise BmoeError(f"{board.label}: the emulated board's Python {what} is missing (the board sysroot: "
                            "build for this board once on that machine, or set BMOE_EDGE_SYSROOT there)")
        raise BmoeError(f"{board.label}: the board has no {what} (the bundle needs Python {manifest.python}); "
                        f"install it (Debian/Raspberry Pi OS: `sudo apt install python{manifest.python}`)")
    if "python" not in facts:
        raise BmoeError(f"{board.label}: the board's Python did not run: {remote.tail(result.stdout)}")
    try:
        py = json.loads(facts["python"])
    except ValueError:
        raise BmoeError(f"{board.label}: unexpected probe output: {facts['python'][:200]}") from None
    py_arch = _norm_arch(str(py.get("machine", "")))
    py_glibc = str(py.get("glibc", "")).replace("glibc", "").strip()
    if emulated:
        arch, glibc = py_arch, py_glibc
        shown = " ".join(wrapper).replace("{sysroot}", "<sysroot>")
        via = f"platform.machine() under `{shown}` (this sshd runs on {uname})"
    else:
        arch = uname if uname == py_arch else py_arch   # a 32-bit userland on a 64-bit kernel: python's
        glibc = facts.get("getconf", "").replace("glibc", "").strip() or py_glibc
        via = "uname -m" if uname == py_arch else f"platform.machine() (uname -m says {uname})"
    return BoardFacts(uname, arch, str(py.get("version", "")), glibc, emulated, via)


def check_facts(facts: BoardFacts, manifest: bundle.Manifest, label: str) -> None:
    if facts.arch != manifest.arch:
        raise BmoeError(f"{label}: the board is {facts.arch} ({facts.via}), bundle {manifest.bundle_id} is for "
                        f"{manifest.arch}: build for this board (`bmoe-edge build --board NAME`)")
    if ".".join(facts.python.split(".")[:2]) != manifest.python:
        raise BmoeError(f"{label}: the board's Python is {facts.python}, bundle {manifest.bundle_id} is for "
                        f"Python {manifest.python}")
    if not facts.glibc or _version_key(facts.glibc) < _version_key(manifest.glibc_required):
        raise BmoeError(f"{label}: the board has glibc {facts.glibc or '(unknown)'}, bundle {manifest.bundle_id} "
                        f"needs glibc >= {manifest.glibc_required}")


# ---------------------------------------------------------------------------------------------------
# Remote scripts (fixed text; every path and name is an argument).

_PREPARE = r"""
dir=$1; id=$2
mkdir -p -- "$dir/releases" || exit 10
[ ! -L "$dir/releases" ] || { echo "$dir/releases is a symlink" >&2; exit 11; }
t="$dir/releases/.write-test.$$"
( : > "$t" ) || exit 10
rm -f -- "$t"
printf 'avail_kb=%s\n' "$(df -Pk -- "$dir/releases" | awk 'NR==2 {print $4}')"
printf 'current=%s\n' "$(readlink -- "$dir/current" 2>/dev/null)"
cd -- "$dir/releases" || exit 10
for d in * .*.partial; do
  case $d in '*'|'.*.partial') continue;; esac
  [ -L "$d" ] && { printf 'symlink %s\n' "$d"; continue; }
  if [ -f "$d/.bmoe-release.json" ]; then
    printf 'release %s %s\n' "$d" "$(head -c 4096 -- "$d/.bmoe-release.json" | tr -d '\n')"
  elif [ -d "$d" ]; then printf 'other %s\n' "$d"; fi
done
"""

# $1 = base dir, then relative paths; prints "<index> <sha256>" or "<index> -" (missing / not a regular file)
_HASH = r"""
base=$1; shift; i=0
for f in "$@"; do
  if [ -f "$base/$f" ] && [ ! -L "$base/$f" ]; then
    if h=$(sha256sum < "$base/$f"); then printf '%s %s\n' "$i" "${h%% *}"; else printf '%s !\n' "$i"; fi
  else printf '%s -\n' "$i"; fi
  i=$((i+1))
done
"""

# $1 = release dir: its symlinks (first one) and every non-directory outside site*/profile (NUL-separated)
_SCAN = r"""
rel=$1
l=$(find "$rel" -type l -print 2>/dev/null | head -n 1)
[ -z "$l" ] || { printf 'SYMLINK\0%s\0' "${l#"$rel"/}"; exit 0; }
cd -- "$rel" || exit 1
find . \( -path ./site -o -path './site.new.*' -o -path ./site.old -o -path ./profile \) -prune -o ! -type d -print0
"""

_MKDIRS = r"""base=$1; shift; cd -- "$base" && mkdir -p -- "$@" """

_COPY = r"""src=$1; dst=$2; shift 2; for f; do cp -p -- "$src/$f" "$dst/$f" || exit 1; done"""

_REMOVE_IN = r"""base=$1; shift; cd -- "$base" || exit 0; for f; do rm -rf -- "./$f"; done"""

_INSTALL = r"""
lock=$1; rel=$2
if command -v flock >/dev/null 2>&1; then
  exec flock "$lock" env BMOE_EDGE_RELEASE="$rel" "$rel/launcher/bmoe-edge.sh" --install-site
fi
exec env BMOE_EDGE_RELEASE="$rel" "$rel/launcher/bmoe-edge.sh" --install-site
"""

_COMMIT = r"""
partial=$1; final=$2; cur=$3
if [ -e "$final" ] || [ -L "$final" ]; then
  [ "$cur" != "$final" ] || { echo "$final is current but incomplete" >&2; exit 12; }
  rm -rf -- "$final"
fi
mv -- "$partial" "$final"
"""

_DEMOTE = r"""
final=$1; partial=$2
rm -rf -- "$partial"; rm -f -- "$final/.bmoe-release.json"; mv -- "$final" "$partial"
"""

_SWITCH = r"""dir=$1; id=$2; cd -- "$dir" && ln -sfn -- "releases/$id" current.tmp && mv -T -- current.tmp current"""

# `sh -c _HANGUP sh ARGV…`: run ARGV, and stop it (SIGTERM) when the SSH connection goes away — a
# Ctrl-C or a killed `generate --host` / `gates --host` does not leave it running on the board. The
# remote stdin stays open while the client lives (nothing is ever sent on it); `cat` sees EOF when the
# connection closes (it reads a copy of stdin: an asynchronous command's own stdin is /dev/null).
_HANGUP = r"""
exec 3<&0
"$@" < /dev/null 3<&- &
pid=$!
( cat <&3 > /dev/null 2>&1; kill -TERM "$pid" 2>/dev/null ) > /dev/null 2>&1 &
exec 3<&-
watcher=$!
wait "$pid"
rc=$?
kill "$watcher" 2>/dev/null
exit "$rc"
"""

_CONFIG_HOME = r"""printf '%s' "${XDG_CONFIG_HOME:-$HOME/.config}" """


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


def list_releases(board: Board, layout: Layout, *, create: bool) -> Releases:
    if create:
        result = board.sh(_PREPARE, layout.install_dir, "", what=f"preparing {layout.install_dir}", check=False)
        if result.exited in (10, 11):
            raise BmoeError(f"{board.label}: install dir {layout.install_dir} is not writable: "
                            f"{remote.tail(result.stderr)}")
        if result.exited != 0:
            raise BmoeError(f"{board.label}: preparing {layout.install_dir} failed: {remote.tail(result.stderr)}")
    else:
        script = _PREPARE.replace('mkdir -p -- "$dir/releases" || exit 10', '[ -d "$dir/releases" ] || exit 0')
        script = script.replace('( : > "$t" ) || exit 10\nrm -f -- "$t"\n', "")
        result = board.sh(script, layout.install_dir, "", what=f"reading {layout.install_dir}")
    avail, link, complete, others = None, "", {}, []
    for line in result.stdout.splitlines():
        if line.startswith("avail_kb="):
            avail = int(line[9:]) if line[9:].isdigit() else None
        elif line.startswith("current="):
            link = line[8:]
        elif line.startswith("release "):
            _, name, stamp_text = [*line.split(" ", 2), ""][:3]
            try:
                stamp = json.loads(stamp_text)
                remote.check_name(name, "release")
            except (ValueError, BmoeError):
                continue
            if isinstance(stamp, dict) and stamp.get("bundle_id") == name:
                complete[name] = stamp
        elif line.startswith(("other ", "symlink ")):
            others.append(line.split(" ", 1)[1])
    return Releases(avail, _release_name(link), link, complete, others)


def _hash_remote(board: Board, base: str, paths: Sequence[str], what: str) -> dict[str, str | None]:
    """sha256 of each path under base on the board (None: missing or not a regular file)."""
    out: dict[str, str | None] = dict.fromkeys(paths)
    if not paths:
        return out
    result = board.sh(_HASH, base, *(bundle.check_relpath(p) for p in paths), what=what)
    for line in result.stdout.splitlines():
        idx, _, digest = line.partition(" ")
        if idx.isdigit() and int(idx) < len(paths) and re.fullmatch(r"[0-9a-f]{64}", digest):
            out[paths[int(idx)]] = digest
    return out


def _scan(board: Board, rel: str) -> tuple[str | None, list[str]]:
    """(first symlink in the release or None, every file outside site*/profile)."""
    result = board.sh(_SCAN, rel, what=f"scanning {rel}")
    parts = [p for p in result.stdout.split("\0") if p]
    if parts[:1] == ["SYMLINK"]:
        return (parts[1] if len(parts) > 1 else "?"), []
    return None, [p[2:] if p.startswith("./") else p for p in parts]


def _expected(manifest: bundle.Manifest, manifest_sha: str) -> dict[str, str]:
    files = {f.path: f.sha256 for f in manifest.files}
    files[bundle.MANIFEST_NAME] = manifest_sha
    return files


def verify_release(board: Board, rel: str, manifest: bundle.Manifest, manifest_sha: str) -> None:
    """Every file of the release on the board has the bundle's sha256; no symlink, nothing unlisted."""
    expected = _expected(manifest, manifest_sha)
    link, present = _scan(board, rel)
    if link is not None:
        raise BmoeError(f"{board.label}: {rel} contains a symlink ({link!r}): refusing it")
    unlisted = sorted(set(present) - set(expected) - {STAMP})
    if unlisted:
        raise BmoeError(f"{board.label}: {rel} holds {unlisted[0]!r}, which is not in the bundle: refusing it")
    hashes = _hash_remote(board, rel, list(expected), f"verifying {rel}")
    for path, want in expected.items():
        got = hashes[path]
        if got != want:
            state = "is missing" if got is None else f"has sha256 {got[:16]}..., the bundle says {want[:16]}..."
            raise BmoeError(f"{board.label}: {path} on the board {state}: refusing the release")


# ---------------------------------------------------------------------------------------------------
# Deploy one host.


@dataclass
class _Bundle:
    dir: Path
    manifest: bundle.Manifest
    manifest_sha: str


def _say(log: Log, label: str, message: str) -> None:
    log(f"[{label}] {message}")


def _upload(board: Board, b: _Bundle, layout: Layout, releases: Releases, result: HostResult, log: Log,
            hooks: Hooks) -> None:
    m = b.manifest
    partial = layout.partial(m.bundle_id)
    expected = _expected(m, b.manifest_sha)
    board.sh("mkdir -p -- \"$1\"", partial, what=f"creating {partial}")
    link, present = _scan(board, partial)
    if link is not None:
        raise BmoeError(f"{board.label}: {partial} contains a symlink ({link!r}): remove it, then deploy again")
    stray = sorted(set(present) - set(expected))
    if stray:
        board.sh(_REMOVE_IN, partial, *stray, what="removing stray files")
    paths = sorted(expected)
    have = _hash_remote(board, partial, paths, "checking what is already on the board")
    missing = [p for p in paths if have[p] != expected[p]]
    result.files = len(paths)
    result.files_present = len(paths) - len(missing)
    # files another release on the board already has: copy them there instead of uploading
    sizes = {f.path: f.size for f in m.files}
    sizes[bundle.MANIFEST_NAME] = (b.dir / bundle.MANIFEST_NAME).stat().st_size
    copies: dict[str, list[str]] = {}
    remaining = [p for p in missing if p != bundle.MANIFEST_NAME]
    newest_first = sorted(releases.complete, key=lambda r: str(releases.complete[r].get("installed_at", "")),
                          reverse=True)
    sources = [r for r in ([releases.current] if releases.current in releases.complete else [])
               + [r for r in newest_first if r != releases.current] if r != m.bundle_id]
    for rid in sources:
        if not remaining:
            break
        found = _hash_remote(board, layout.release(rid), remaining, f"looking for unchanged files in {rid}")
        hits = [p for p in remaining if found[p] == expected[p]]
        if hits:
            copies[rid] = hits
            remaining = [p for p in remaining if p not in hits]
    copied = {p for hits in copies.values() for p in hits}
    upload = [p for p in missing if p not in copied]
    need = sum(sizes[p] for p in missing) + SITE_FACTOR * sum(sizes[w] for w in m.wheels)
    if releases.avail_kb is not None and releases.avail_kb * 1024 < need:
        raise BmoeError(f"{board.label}: not enough space in {layout.install_dir}: the release needs about "
                        f"{_mib(need)}, {_mib(releases.avail_kb * 1024)} is free (lower --keep, or free space)")
    dirs = sorted({posixpath.dirname(p) for p in missing if "/" in p})
    if dirs:
        board.sh(_MKDIRS, partial, *dirs, what="creating directories")
    for rid, hits in copies.items():
        board.sh(_COPY, layout.release(rid), partial, *hits, what=f"copying unchanged files from {rid}")
        result.files_copied += len(hits)
    if copies:
        _say(log, board.label, f"copied {result.files_copied} unchanged files from "
             f"{', '.join(copies)} on the board")
    if upload:
        total = sum(sizes[p] for p in upload)
        _say(log, board.label, f"uploading {len(upload)} files ({_mib(total)})")
        for p in upload:
            local = b.dir / p
            board.put(local, inside(partial, p))
            result.files_uploaded += 1
            result.bytes_uploaded += sizes[p]
    else:
        _say(log, board.label, "nothing to upload: every file is already on the board")
    if "uploaded" in hooks:
        hooks["uploaded"](partial)
    _say(log, board.label, f"verifying {len(paths)} files on the board (sha256sum)")
    verify_release(board, partial, m, b.manifest_sha)


def _install(board: Board, b: _Bundle, layout: Layout, releases: Releases, log: Log) -> None:
    m = b.manifest
    partial = layout.partial(m.bundle_id)
    _say(log, board.label, "installing (unpacking the wheels into site/ on the board)")
    board.sh(_INSTALL, layout.lock, partial, what="installing the release (launcher --install-site)",
             timeout=INSTALL_TIMEOUT)
    import yaml

    board.sh("mkdir -p -- \"$1\"", f"{partial}/{PROFILE_DIR}", what="creating profile/")
    board.write_bytes(f"{partial}/{PROFILE_DIR}/{remote.check_name(m.board, 'board')}.yaml",
                      ("# The resolved profile this release was built with (from its manifest.json).\n"
                       + yaml.safe_dump(m.profile, sort_keys=False)).encode())
    check = board.run(remote.env_command({"BMOE_EDGE_RELEASE": partial}, [f"{partial}/{bundle.LAUNCHER_SCRIPT}",
                                                                          "--version"]),
                      what="running the installed release (--version)", check=False, timeout=600)
    if check.exited != 0 or f"machine: {m.arch}" not in check.stdout:
        raise BmoeError(f"{board.label}: the installed release does not run on the board (exit {check.exited}): "
                        f"{remote.tail(check.stderr or check.stdout)}")
    if m.extra.get("hook") and "hook: yes" not in check.stdout:
        raise BmoeError(f"{board.label}: the installed release says it has no expert-ready hook")
    stamp = {"bundle_id": m.bundle_id, "board": m.board, "arch": m.arch, "installed_at": _now(),
             "files": len(m.files), "bmoe_edge_version": m.bmoe_edge_version}
    board.write_bytes(f"{partial}/{STAMP}", (json.dumps(stamp) + "\n").encode())
    board.sh(_COMMIT, partial, layout.release(m.bundle_id),
             layout.release(releases.current) if releases.current else "",
             what="committing the release")


def _gates(board: Board, rel: str, *, full: bool = False, json_out: bool = True,
           out: Any = None) -> tuple[int, str, dict[str, Any] | None]:
    """Run the gates of a release on the board: (exit code, stdout, parsed JSON report or None)."""
    args = [f"{rel}/{bundle.LAUNCHER_SCRIPT}", "gates", *([] if full else ["--quick"]),
            "--fixtures", f"{rel}/{bundle.FIXTURES_DIR}", *(["--json"] if json_out else [])]
    env = {"BMOE_EDGE_RELEASE": rel, "BMOE_EDGE_PROFILES": f"{rel}/{PROFILE_DIR}"}
    result = board.sh(_HANGUP, "env", *(f"{k}={v}" for k, v in env.items()), *args, what="running the gates",
                      check=False, timeout=GATES_TIMEOUT, out=out, err=sys.stderr if out is not None else None)
    report = None
    if json_out:
        with contextlib.suppress(ValueError):
            report = json.loads(result.stdout)
    if result.exited != 0 and report is None:
        return result.exited, result.stdout, None
    return result.exited, result.stdout, report if isinstance(report, dict) else None


def gates_record(report: dict[str, Any], bundle_id: str, quick: bool) -> dict[str, Any]:
    failing = [f"{c.get('arch')} {c.get('quant')} split={c.get('split')} {c.get('config')}"
               + (f": {c['error']}" if c.get("error") else
                  f": first difference at step {c.get('first_difference')}")
               for c in report.get("cells", []) if not c.get("passed")]
    return {"bundle_id": bundle_id, "at": _now(), "quick": quick, "passed": int(report.get("passed", 0)),
            "failed": int(report.get("failed", 0)), "failing": failing}


def _write_board_files(board: Board, b: _Bundle, layout: Layout, releases: Releases, previous: str | None,
                       gates: dict[str, Any] | None, state: dict[str, Any]) -> None:
    m = b.manifest
    now = _now()
    history = state.get("releases") if isinstance(state.get("releases"), dict) else {}
    entry = dict(history.get(m.bundle_id) or {})
    entry["deployed_at"] = now
    if gates is not None:
        entry["gates"] = gates
    history[m.bundle_id] = entry
    keep_ids = set(releases.complete) | {m.bundle_id}
    new_state = {
        "format": 1, "bundle_id": m.bundle_id, "board": m.board, "deployed_at": now,
        "deployed_by": f"bmoe-edge {__version__}", "previous": previous,
        "gates": entry.get("gates"), "install_dir": layout.install_dir,
        "releases": {k: v for k, v in history.items() if k in keep_ids},
    }
    board.write_bytes(layout.state, (json.dumps(new_state, indent=2) + "\n").encode())
    board.sh("mkdir -p -- \"$1/bin\" \"$1/systemd\"", layout.install_dir, what="creating bin/ and systemd/")
    board.write_bytes(f"{layout.install_dir}/bin/bmoe-edge", wrapper_script(layout.install_dir).encode(), 0o755)
    template = b.dir / UNIT_TEMPLATE
    if template.is_file():
        unit = render_unit(template.read_text(encoding="utf-8"), layout.install_dir, board.conn.user)
        board.write_bytes(f"{layout.install_dir}/systemd/{UNIT_NAME}", unit.encode())
    write_pointer(board, {"install_dir": layout.install_dir, "board": m.board, "bundle_id": m.bundle_id})


def write_pointer(board: Board, data: dict[str, Any]) -> None:
    home = board.sh(_CONFIG_HOME, what="finding ~/.config").stdout.strip()
    if not home.startswith("/"):
        return
    board.sh("mkdir -p -- \"$1\"", f"{home}/bmoe-edge", what="creating ~/.config/bmoe-edge")
    board.write_bytes(f"{home}/{POINTER}", (json.dumps(data) + "\n").encode())


def read_pointer(board: Board) -> dict[str, Any] | None:
    home = board.sh(_CONFIG_HOME, what="finding ~/.config").stdout.strip()
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


def wrapper_script(install_dir: str) -> str:
    return (
        "#!/bin/sh\n"
        "# bmoe-edge on this board: runs the current release. Written by `bmoe-edge deploy`; put this\n"
        "# directory on PATH to type `bmoe-edge gates` or `bmoe-edge generate --board ...` here.\n"
        f"install_dir={shlex.quote(install_dir)}\n"
        'BMOE_EDGE_PROFILES="$install_dir/current/profile${BMOE_EDGE_PROFILES:+:$BMOE_EDGE_PROFILES}"\n'
        'BMOE_EDGE_FIXTURES=${BMOE_EDGE_FIXTURES:-$install_dir/current/fixtures}\n'
        "export BMOE_EDGE_PROFILES BMOE_EDGE_FIXTURES\n"
        'exec "$install_dir/current/launcher/bmoe-edge.sh" "$@"\n'
    )


def systemd_escape(text: str) -> str:
    """Text for inside a double-quoted word of a unit file: specifiers, variables, quotes escaped."""
    if "\n" in text or "\0" in text:
        raise BmoeError(f"{text!r} cannot be written into a systemd unit")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")


def render_unit(template: str, install_dir: str, user: str) -> str:
    return template.replace("@INSTALL_DIR@", systemd_escape(install_dir)).replace("@USER@", systemd_escape(user))


def _prune(board: Board, layout: Layout, keep: int, current: str, previous: str | None, log: Log) -> list[str]:
    rel = list_releases(board, layout, create=False)
    ordered = sorted(rel.complete, key=lambda r: str(rel.complete[r].get("installed_at", "")), reverse=True)
    kept = set(ordered[:keep]) | {current} | ({previous} if previous else set())
    doomed = [r for r in ordered if r not in kept]
    stale = [o for o in rel.others if o.startswith(".") and o.endswith(".partial")
             and o != f".{current}.partial" and "/" not in o]
    if doomed or stale:
        board.sh(_REMOVE_IN, layout.releases, *doomed, *stale, what="deleting old releases")
        if doomed:
            _say(log, board.label, f"deleted {len(doomed)} old release(s) beyond --keep {keep}: {', '.join(doomed)}")
    return [r for r in ordered if r in kept]


def deploy_host(b: _Bundle, target: Target, *, options: SshOptions, install_dir: str | None = None, keep: int = KEEP,
                gates: bool = False, log: Log, hooks: Hooks | None = None) -> HostResult:
    m = b.manifest
    hooks = hooks or {}
    started = time.monotonic()
    ssh = m.profile.get("ssh") if isinstance(m.profile.get("ssh"), dict) else {}
    assert isinstance(ssh, dict)
    board = Board(target, options, default_user=ssh.get("user"), default_port=ssh.get("port"))
    result = HostResult(host=board.label, board=m.board)
    layout = Layout(install_dir or target.install_dir or str(ssh.get("install_dir") or ""))
    result.install_dir = layout.install_dir
    with board:
        facts = probe(board, m)
        _say(log, board.label, f"board: {facts.arch} via {facts.via}; Python {facts.python}; glibc {facts.glibc}")
        check_facts(facts, m, board.label)
        releases = list_releases(board, layout, create=True)
        previous = releases.current
        final = layout.release(m.bundle_id)
        state = read_state(board, layout)
        if m.bundle_id in releases.complete:
            _say(log, board.label, f"{m.bundle_id} is already on the board: verifying it")
            result.files = len(m.files) + 1
            result.files_present = result.files
            try:
                verify_release(board, final, m, b.manifest_sha)
            except BmoeError as exc:
                if releases.current == m.bundle_id:
                    raise BmoeError(f"{exc} (it is the current release: `bmoe-edge rollback` first, then deploy "
                                    "again to repair it)") from None
                _say(log, board.label, f"{exc}; re-uploading it")
                board.sh(_DEMOTE, final, layout.partial(m.bundle_id), what="reopening the release")
                releases.complete.pop(m.bundle_id)
                result.files_present = 0
        if m.bundle_id not in releases.complete:
            _upload(board, b, layout, releases, result, log, hooks)
            _install(board, b, layout, releases, log)
        gate_record = None
        if gates:
            _say(log, board.label, "running the gates on the board (quick matrix) before switching")
            t0 = time.monotonic()
            code, out, report = _gates(board, final)
            if report is None:
                raise BmoeError(f"{board.label}: the gates did not run (exit {code}): {remote.tail(out)}")
            gate_record = gates_record(report, m.bundle_id, quick=True)
            result.gates = gate_record
            _say(log, board.label, f"gates: {gate_record['passed']} passed, {gate_record['failed']} failed "
                 f"({time.monotonic() - t0:.0f} s)")
            if code != 0 or gate_record["failed"]:
                shown = "; ".join(gate_record["failing"][:3]) or f"exit {code}"
                more = len(gate_record["failing"]) - 3
                raise BmoeError(f"{board.label}: gates failed on the board ({gate_record['failed']} of "
                                f"{gate_record['failed'] + gate_record['passed']} cells): {shown}"
                                + (f" (and {more} more)" if more > 0 else "")
                                + f"; `current` left at {previous or 'nothing'}")
        if "before_switch" in hooks:
            hooks["before_switch"](final)
        try:
            verify_release(board, final, m, b.manifest_sha)
        except BmoeError:
            if releases.current != m.bundle_id:
                board.sh(_DEMOTE, final, layout.partial(m.bundle_id), what="reopening the release")
            raise
        if releases.current != m.bundle_id:
            board.sh(_SWITCH, layout.install_dir, m.bundle_id, what="switching current")
            _say(log, board.label, f"current -> releases/{m.bundle_id}")
            result.action = "deployed"
        else:
            result.action = "redeployed"
            previous = state.get("previous") if isinstance(state.get("previous"), str) else None
            _say(log, board.label, f"{m.bundle_id} was already current")
        _write_board_files(board, b, layout, list_releases(board, layout, create=False), previous, gate_record,
                           state)
        result.releases = _prune(board, layout, keep, m.bundle_id, previous, log)
    result.ok = True
    result.bundle_id = m.bundle_id
    result.previous = previous
    result.deployed_at = _now()
    result.gates = result.gates or (read_gates(state, m.bundle_id))
    result.seconds = time.monotonic() - started
    return result


def read_gates(state: dict[str, Any], bundle_id: str) -> dict[str, Any] | None:
    releases = state.get("releases")
    if isinstance(releases, dict) and isinstance(releases.get(bundle_id), dict):
        gates = releases[bundle_id].get("gates")
        return gates if isinstance(gates, dict) else None
    return None


# ---------------------------------------------------------------------------------------------------
# Fleets: many hosts in parallel; one failing host never stops the others.


def run_fleet(targets: Sequence[Target], work: Callable[[Target], HostResult], *, jobs: int | None = None,
              what: str = "deploy") -> list[HostResult]:
    def one(target: Target) -> HostResult:
        started = time.monotonic()
        try:
            return work(target)
        except BmoeError as exc:
            return HostResult(host=target.label, board=target.board, error=str(exc),
                              seconds=time.monotonic() - started, action=what)
        except Exception as exc:   # a bug must not take the other hosts down; report it
            return HostResult(host=target.label, board=target.board, action=what,
                              error=f"{target.label}: unexpected {type(exc).__name__}: {exc}",
                              seconds=time.monotonic() - started)

    if len(targets) == 1:
        return [one(targets[0])]
    with ThreadPoolExecutor(max_workers=jobs or min(len(targets), 16)) as pool:
        return list(pool.map(one, targets))


def _stderr_log() -> Log:
    lock = threading.Lock()

    def log(message: str) -> None:
        with lock:
            print(message, file=sys.stderr, flush=True)

    return log


def load_bundle(bundle_dir: Path) -> _Bundle:
    manifest = bundle.verify_bundle(bundle_dir)
    remote.check_name(manifest.bundle_id, "bundle id")
    remote.check_name(manifest.board, "board")
    return _Bundle(Path(bundle_dir), manifest, bundle.sha256_file(Path(bundle_dir) / bundle.MANIFEST_NAME))


def resolve_targets(hosts: Sequence[str], inventory: Path | None, board: str | None,
                    profile_host: str | None = None) -> list[Target]:
    targets = [remote.parse_target(h, board=board) for h in hosts]
    if inventory is not None:
        targets += [t if t.board or not board else Target(t.host, t.user, t.port, board, t.install_dir)
                    for t in remote.load_inventory(inventory)]
    if not targets and profile_host:
        targets = [remote.parse_target(profile_host, board=board)]
    if not targets:
        raise BmoeError("no host: give --host USER@HOST[:PORT] (repeatable) or --inventory FILE")
    return targets


def deploy(
    bundle_dir: Path | None,
    hosts: Sequence[Target | str],
    *,
    board: str | None = None,
    dist: Path = Path("dist"),
    keep: int = KEEP,
    gates: bool = False,
    accept_new_host_key: bool = False,
    ssh_config: Path | None = None,
    install_dir: str | None = None,
    log: Log | None = None,
    hooks: Hooks | None = None,
    jobs: int | None = None,
) -> list[HostResult]:
    """Deploy a bundle (or each host's board's bundle under `dist/`) to every host, in parallel.

    A host's failure is its HostResult (ok False, error set); it never stops the others.
    """
    if keep < 1:
        raise BmoeError(f"--keep must be at least 1 (got {keep})")
    log = log or _stderr_log()
    options = SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
    targets = [remote.parse_target(h, board=board) if isinstance(h, str) else h for h in hosts]
    if not targets:
        raise BmoeError("no host to deploy to")
    bundles: dict[Path, _Bundle | BmoeError] = {}
    lock = threading.Lock()

    def bundle_for(target: Target) -> _Bundle:
        name = target.board or board
        path = Path(bundle_dir) if bundle_dir is not None else (dist / name if name else None)
        if path is None:
            raise BmoeError(f"{target.label}: which board is it? give --board NAME (or `board:` in the inventory)")
        with lock:
            if path not in bundles:
                try:
                    if not (path / bundle.MANIFEST_NAME).is_file():
                        raise BmoeError(f"no bundle in {path}: build it with `bmoe-edge build --board "
                                        f"{name or '<board>'}`")
                    bundles[path] = load_bundle(path)
                except BmoeError as exc:
                    bundles[path] = exc
            found = bundles[path]
        if isinstance(found, BmoeError):
            raise BmoeError(f"{target.label}: {found}")
        if name and found.manifest.board != name:
            raise BmoeError(f"{target.label}: the bundle in {path} is for board {found.manifest.board}, "
                            f"the host is a {name}")
        return found

    def work(target: Target) -> HostResult:
        return deploy_host(bundle_for(target), target, options=options, install_dir=install_dir, keep=keep,
                           gates=gates, log=log, hooks=hooks)

    return run_fleet(targets, work, jobs=jobs, what="deploy")


# ---------------------------------------------------------------------------------------------------
# Rollback and status.


def _layout_for(board: Board, target: Target, install_dir: str | None, profile_dir: str | None) -> Layout:
    chosen = install_dir or target.install_dir or profile_dir
    if not chosen:
        pointer = read_pointer(board)
        chosen = str(pointer.get("install_dir", "")) if pointer else ""
    if not chosen:
        raise BmoeError(f"{board.label}: no deploy found there (no ~/.config/{POINTER}); pass --install-dir or "
                        "--board")
    return Layout(chosen)


def _profile_ssh(board_name: str | None) -> dict[str, Any]:
    if not board_name:
        return {}
    from bmoe_edge import profiles

    ssh = profiles.load_profile(board_name).ssh
    return {"user": ssh.user, "port": ssh.port, "install_dir": ssh.install_dir}


def connect(target: Target, options: SshOptions, board_name: str | None = None,
            install_dir: str | None = None) -> tuple[Board, Layout]:
    """An open connection to the board and where its deploys live."""
    defaults = _profile_ssh(target.board or board_name)
    board = Board(target, options, default_user=defaults.get("user"), default_port=defaults.get("port"))
    board.open()
    try:
        return board, _layout_for(board, target, install_dir, defaults.get("install_dir"))
    except BaseException:
        board.close()
        raise


def rollback_host(target: Target, *, options: SshOptions, board_name: str | None = None,
                  install_dir: str | None = None, log: Log) -> HostResult:
    started = time.monotonic()
    board, layout = connect(target, options, board_name, install_dir)
    with board:
        result = HostResult(host=board.label, install_dir=layout.install_dir, action="rolled back")
        releases = list_releases(board, layout, create=False)
        state = read_state(board, layout)
        current = releases.current
        if current is None:
            raise BmoeError(f"{board.label}: nothing is deployed in {layout.install_dir}")
        previous = state.get("previous") if state.get("bundle_id") == current else None
        if not isinstance(previous, str) or previous not in releases.complete or previous == current:
            older = sorted((r for r in releases.complete if r != current),
                           key=lambda r: str(releases.complete[r].get("installed_at", "")), reverse=True)
            previous = older[0] if older else None
        if previous is None:
            raise BmoeError(f"{board.label}: no previous release in {layout.install_dir} to roll back to "
                            f"(current: {current})")
        rel = layout.release(previous)
        raw, manifest = _release_manifest(board, rel, "cannot roll back to it")
        import hashlib

        _say(log, board.label, f"verifying {previous} on the board")
        verify_release(board, rel, manifest, hashlib.sha256(raw).hexdigest())
        board.sh(_SWITCH, layout.install_dir, previous, what="switching current")
        _say(log, board.label, f"current -> releases/{previous} (was {current})")
        history = state.get("releases") if isinstance(state.get("releases"), dict) else {}
        entry = dict(history.get(previous) or {})
        entry["deployed_at"] = _now()
        history[previous] = entry
        new_state = {**state, "format": 1, "bundle_id": previous, "board": manifest.board,
                     "deployed_at": entry["deployed_at"], "previous": current, "gates": entry.get("gates"),
                     "install_dir": layout.install_dir, "releases": history, "rolled_back_from": current}
        board.write_bytes(layout.state, (json.dumps(new_state, indent=2) + "\n").encode())
        write_pointer(board, {"install_dir": layout.install_dir, "board": manifest.board, "bundle_id": previous})
    result.ok = True
    result.board = manifest.board
    result.bundle_id = previous
    result.previous = current
    result.deployed_at = entry["deployed_at"]
    result.gates = entry.get("gates")
    result.seconds = time.monotonic() - started
    return result


def status_host(target: Target, *, options: SshOptions, board_name: str | None = None,
                install_dir: str | None = None) -> HostResult:
    started = time.monotonic()
    board, layout = connect(target, options, board_name, install_dir)
    with board:
        result = HostResult(host=board.label, install_dir=layout.install_dir, action="status")
        releases = list_releases(board, layout, create=False)
        state = read_state(board, layout)
        if releases.current is None:
            raise BmoeError(f"{board.label}: nothing is deployed in {layout.install_dir}"
                            + (f" (`current` is {releases.current_link!r})" if releases.current_link else ""))
        stamp = releases.complete.get(releases.current)
        result.bundle_id = releases.current
        result.board = (stamp or {}).get("board") or state.get("board")
        if state.get("bundle_id") == releases.current:
            result.deployed_at = state.get("deployed_at")
            result.previous = state.get("previous")
        else:
            result.note = (f"state.json says {state.get('bundle_id')} (an interrupted deploy?); "
                           "`current` is the truth")
        if stamp is None:
            result.note = "the current release has no completeness stamp"
        result.gates = read_gates(state, releases.current)
        result.releases = sorted(releases.complete, key=lambda r: str(releases.complete[r].get("installed_at", "")),
                                 reverse=True)
    result.ok = True
    result.seconds = time.monotonic() - started
    return result


def rollback(hosts: Sequence[Target], *, options: SshOptions, board_name: str | None = None,
             install_dir: str | None = None, log: Log | None = None) -> list[HostResult]:
    log = log or _stderr_log()
    return run_fleet(hosts, lambda t: rollback_host(t, options=options, board_name=board_name,
                                                    install_dir=install_dir, log=log), what="rollback")


def status(hosts: Sequence[Target], *, options: SshOptions, board_name: str | None = None,
           install_dir: str | None = None) -> list[HostResult]:
    return run_fleet(hosts, lambda t: status_host(t, options=options, board_name=board_name,
                                                  install_dir=install_dir), what="status")


# ---------------------------------------------------------------------------------------------------
# Reports.


def _gates_text(g: dict[str, Any] | None) -> str:
    if not g:
        return "-"
    return f"{g['passed']} passed, {g['failed']} failed" + (" (quick)" if g.get("quick") else "")


def _strip_host(r: HostResult) -> str:
    err = r.error or ""
    for prefix in (f"{r.host}: ",):
        if err.startswith(prefix):
            return err[len(prefix):]
    return re.sub(r"^\S+@\S+: ", "", err)


def format_table(results: Sequence[HostResult]) -> str:
    rows = [("HOST", "BOARD", "RESULT", "DETAIL")]
    for r in results:
        if r.ok:
            if r.action == "status":
                detail = (f"{r.bundle_id}; deployed {r.deployed_at or '?'}; gates {_gates_text(r.gates)}"
                          + (f"; {r.note}" if r.note else ""))
            elif r.action == "rolled back":
                detail = f"{r.previous} -> {r.bundle_id}"
            else:
                detail = (f"{r.bundle_id}; uploaded {r.files_uploaded} files ({_mib(r.bytes_uploaded)}); "
                          f"gates {_gates_text(r.gates)}; {r.seconds:.0f} s")
            rows.append((r.host, r.board or "-", "ok", detail))
        else:
            rows.append((r.host, r.board or "-", "FAILED", _strip_host(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3] for row in rows]
    failed = sum(not r.ok for r in results)
    lines.append(f"{len(results) - failed} of {len(results)} hosts ok" + (f", {failed} failed" if failed else ""))
    return "\n".join(lines)


def format_one(r: HostResult) -> str:
    """A successful single-host result, for humans."""
    if r.action == "status":
        lines = [f"host:        {r.host}", f"install dir: {r.install_dir}",
                 f"current:     releases/{r.bundle_id}", f"board:       {r.board}",
                 f"deployed:    {r.deployed_at or '?'}", f"gates:       {_gates_text(r.gates)}"]
        if r.gates and r.gates.get("failing"):
            lines += [f"             {f}" for f in r.gates["failing"]]
        lines.append(f"previous:    {r.previous or '-'}")
        lines.append(f"releases:    {', '.join(r.releases) or '-'}")
        if r.note:
            lines.append(f"note:        {r.note}")
        return "\n".join(lines)
    if r.action == "rolled back":
        return f"{r.host}: rolled back to {r.bundle_id} (was {r.previous})"
    moved = (f"uploaded {r.files_uploaded} of {r.files} files ({_mib(r.bytes_uploaded)}), "
             f"{r.files_copied} copied on the board, {r.files_present} already there")
    return (f"{r.host}: {r.action} {r.bundle_id} in {r.install_dir} ({r.seconds:.0f} s): {moved}; "
            f"gates {_gates_text(r.gates)}; previous {r.previous or '-'}")


def report_json(results: Sequence[HostResult]) -> str:
    return json.dumps({"ok": all(r.ok for r in results), "hosts": [r.as_dict() for r in results]}, indent=2)


# ---------------------------------------------------------------------------------------------------
# On the board: gates and generate through the current release.


def current_release(board: Board, layout: Layout) -> tuple[str, str, bundle.Manifest]:
    """(release id, release dir, its manifest) of what `current` points at, resolved once."""
    link = board.sh('readlink -- "$1" || true', layout.current, what="reading current").stdout.strip()
    rid = _release_name(link)
    if rid is None:
        raise BmoeError(f"{board.label}: nothing is deployed in {layout.install_dir}"
                        + (f" (`current` is {link!r})" if link else "") + ": run `bmoe-edge deploy` first")
    rel = layout.release(rid)
    _, manifest = _release_manifest(board, rel, "deploy again")
    return rid, rel, manifest


def _release_manifest(board: Board, rel: str, remedy: str) -> tuple[bytes, bundle.Manifest]:
    """A release's manifest on the board: its raw bytes (for the sha256) and the parsed form."""
    raw = board.read_bytes(f"{rel}/{bundle.MANIFEST_NAME}")
    if raw is None:
        raise BmoeError(f"{board.label}: {rel}/manifest.json is missing: {remedy}")
    try:
        return raw, bundle.manifest_from_dict(json.loads(raw), f"{rel}/manifest.json")
    except ValueError as exc:
        raise BmoeError(f"{board.label}: {rel}/manifest.json is not valid JSON: {exc}") from None


def _release_env(rel: str) -> dict[str, str]:
    return {"BMOE_EDGE_RELEASE": rel, "BMOE_EDGE_PROFILES": f"{rel}/{PROFILE_DIR}"}


def generate_args(*, max_tokens: int, overrides: Mapping[str, object], temp: float, top_k: int, top_p: float,
                  seed: int, as_json: bool, progress: bool, csv_path: str | None) -> list[str]:
    """`bmoe-edge generate` options for the board: only what was given (None = the profile's default)."""
    flags = {"cache_mb": "--cache-mb", "cache_floor_mb": "--cache-floor-mb", "cache_ceil_mb": "--cache-ceil-mb",
             "io_threads": "--io-threads", "read_path": "--read-path", "dense": "--dense", "threads": "--threads",
             "ctx": "--ctx"}
    toggles = {"stream": ("--stream", "--no-stream"), "overlap": ("--overlap", "--no-overlap")}
    args = ["-n", str(max_tokens)]
    for key, value in overrides.items():
        if value is None:
            continue
        if key in toggles:
            args.append(toggles[key][0] if value else toggles[key][1])
        elif key in flags:
            args += [flags[key], str(value)]
        else:
            raise BmoeError(f"generate option {key} cannot be passed to the board")
    args += ["--temp", repr(temp), "--top-k", str(top_k), "--top-p", repr(top_p), "--seed", str(seed)]
    if as_json:
        args.append("--json")
    if progress:
        args.append("--progress")
    if csv_path:
        args += ["--csv", csv_path]
    return args


def board_generate(target: Target, model: str, prompt: str, args: Sequence[str], *, options: SshOptions,
                   board_name: str | None = None, install_dir: str | None = None,
                   out: Any = None, err: Any = None) -> int:
    """Run `generate` on the board through its current release, streaming its output back as it comes.

    Returns the board command's exit code (its own `error:` line has already been streamed to `err`).
    """
    board, layout = connect(target, options, board_name, install_dir)
    with board:
        _rid, rel, manifest = current_release(board, layout)
        if board_name and board_name != manifest.board:
            raise BmoeError(f"{board.label}: the deployed release is for board {manifest.board}, not {board_name}")
        argv = [f"{rel}/{bundle.LAUNCHER_SCRIPT}", "generate", "--board", manifest.board, "-m", model, "-p", prompt,
                *args]
        env = [f"{k}={v}" for k, v in _release_env(rel).items()]
        result = board.sh(_HANGUP, "env", *env, *argv, what="generate", check=False,
                          out=out or sys.stdout, err=err or sys.stderr)
        return int(result.exited)


def _text_report(text: str) -> dict[str, Any] | None:
    m = re.search(r"^gates: (\d+) passed, (\d+) failed\s*$", text, re.M)
    if not m:
        return None
    cells = [{"passed": False, "error": line[5:].strip()} for line in text.splitlines() if line.startswith("FAIL ")]
    return {"passed": int(m[1]), "failed": int(m[2]), "cells": cells}


def board_gates(target: Target, *, options: SshOptions, full: bool = False, as_json: bool = False,
                board_name: str | None = None, install_dir: str | None = None, out: Any = None) -> tuple[int, str]:
    """Run the current release's gates on the board (quick matrix unless `full`) with its own fixtures.

    Text output streams back as the cells finish; with `as_json` the JSON report is returned whole.
    The result is recorded in the board's state.json (what `status` shows). Returns (exit code, stdout).
    """
    board, layout = connect(target, options, board_name, install_dir)
    with board:
        rid, rel, _manifest = current_release(board, layout)
        code, stdout, report = _gates(board, rel, full=full, json_out=as_json,
                                      out=None if as_json else (out or sys.stdout))
        if not as_json:
            report = _text_report(stdout)
        if report is not None:
            state = read_state(board, layout)
            if state.get("bundle_id") == rid:
                record = gates_record(report, rid, quick=not full)
                if not as_json:
                    record["failing"] = [c["error"] for c in report.get("cells", [])]
                history = state.get("releases") if isinstance(state.get("releases"), dict) else {}
                history.setdefault(rid, {})["gates"] = record
                state.update(gates=record, releases=history)
                board.write_bytes(layout.state, (json.dumps(state, indent=2) + "\n").encode())
        elif code == 0:
            code = 1
        return code, stdout


# ---------------------------------------------------------------------------------------------------
# Any other command of the current release (`tune --host`).

CONFIG_HOME_SCRIPT = _CONFIG_HOME


def run_release(board: Board, rel: str, args: Sequence[str], *, what: str, timeout: float | None = None) -> Any:
    """`bmoe-edge ARGS…` through a release's launcher on the board (its profiles and fixtures), stopped
    when the connection goes away; returns fabric's Result (stdout and stderr captured, never raises on
    the command's own exit code)."""
    env = [f"{k}={v}" for k, v in _release_env(rel).items()]
    return board.sh(_HANGUP, "env", *env, f"{rel}/{bundle.LAUNCHER_SCRIPT}", *args, what=what, check=False,
                    timeout=timeout)
