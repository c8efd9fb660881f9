"""What the board is, asked the way the bundle's launcher will run there, checked against the bundle
before anything is uploaded — with this checkout's profile of the board, so nothing the bundle says
runs before its signature holds (a bundle for a board this checkout does not know is probed after)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from bmoe_edge.boards import bundle, profiles, sysroot
from bmoe_edge.boards.checks import version_key
from bmoe_edge.boards.profiles import BoardProfile
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.commands import Board, tail
from bmoe_edge.fleet.scripts import PROBE, PY_PROBE

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


def norm_arch(machine: str) -> str:
    m = machine.strip().lower()
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(m, m)


def checkout_profile(board: str) -> BoardProfile | None:
    """This checkout's profile of a board (shipped or the user's), or None: what a deploy probes the
    board with and logs in with before the bundle's signature holds — never the bundle's own profile,
    whose `exec_wrapper` or sysroot a tampered bundle would have made run its payload."""
    try:
        return profiles.load_profile(board)
    except BmoeError:
        return None


def probe_words(profile: BoardProfile, manifest: bundle.Manifest, *, verified: bool) -> tuple[list[str], str]:
    """(the exec wrapper, the sysroot it runs in) to probe with. From this checkout's profile, the
    sysroot is where this machine keeps it; from a bundle's profile (`verified`: only once its signature
    held), the sysroot the bundle was built against (its manifest says where)."""
    wrapper = list(profile.exec_wrapper or ())
    if not wrapper:
        return [], ""
    if verified:
        extra = manifest.extra.get("sysroot")
        return wrapper, str(extra.get("path", "")) if isinstance(extra, dict) else ""
    try:
        return wrapper, str(sysroot.sysroot_for(profile.arch, manifest.python).path)
    except BmoeError:
        return wrapper, ""


def probe(board: Board, manifest: bundle.Manifest, exec_wrapper: Sequence[str] = (),
          sysroot_default: str = "") -> BoardFacts:
    """Ask the board what it is, the way the bundle's launcher will run there (through the profile's
    `exec_wrapper` on an emulated board, `{sysroot}` standing for `sysroot_default`)."""
    wrapper = list(exec_wrapper)
    emulated = bool(wrapper)
    python = ("{sysroot}/usr/bin/python" if emulated else "python") + manifest.python
    result = board.sh(PROBE, sysroot_default, python, PY_PROBE, *wrapper, what="probing the board")
    facts: dict[str, str] = {}
    for line in result.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("uname", "getconf", "missing", "python", "python_rc"):
            facts[key] = value.strip()
    uname = norm_arch(facts.get("uname", ""))
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
        raise BmoeError(f"{board.label}: the board's Python did not run: {tail(result.stdout)}")
    try:
        py = json.loads(facts["python"])
    except ValueError:
        raise BmoeError(f"{board.label}: unexpected probe output: {facts['python'][:200]}") from None
    py_arch = norm_arch(str(py.get("machine", "")))
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
    if not facts.glibc or version_key(facts.glibc) < version_key(manifest.glibc_required):
        raise BmoeError(f"{label}: the board has glibc {facts.glibc or '(unknown)'}, bundle {manifest.bundle_id} "
                        f"needs glibc >= {manifest.glibc_required}")
