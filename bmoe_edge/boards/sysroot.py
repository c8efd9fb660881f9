"""The board sysroot: a Debian arm64 userland unpacked from .deb packages, no host apt changes.

It serves two purposes:

- the cross build reads the target's Python headers from it (Debian's `libpython3.X-dev`);
- the emulated board runs the target's Python from it: `qemu-aarch64 -L <sysroot> <sysroot>/usr/bin/python3.X`.

How it is made: `apt-get update` and `apt-get download` with a private configuration (its own
sources.list with deb.debian.org, lists directory, cache and an empty dpkg status, `APT::Architecture=arm64`),
so neither the host's apt state nor its architectures (`dpkg --add-architecture`) change; then
`dpkg -x` of every package into a staging directory that replaces the sysroot only when complete.
A stamp (release, architecture, package list) makes a second call a no-op. Location:
`~/.cache/bmoe-edge/sysroots/<release>-<arch>/` (or under `$BMOE_EDGE_CACHE`).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.errors import BmoeError
from bmoe_edge.llama_source import cache_dir

STAMP_NAME = ".bmoe-sysroot.json"
SYSROOT_FORMAT = 1
MIRROR_ENV = "BMOE_EDGE_DEBIAN_MIRROR"
SECURITY_MIRROR_ENV = "BMOE_EDGE_DEBIAN_SECURITY_MIRROR"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")

# The board's Python version -> the Debian release that ships it as python3.
DEBIAN_RELEASE_FOR_PYTHON = {"3.11": "bookworm"}
# profile arch -> Debian architecture, GNU triple
DEBIAN_ARCH = {"aarch64": ("arm64", "aarch64-linux-gnu")}


def _packages(python: str) -> tuple[str, ...]:
    """What Python (headers + interpreter + the stdlib's compiled modules) needs, bookworm names."""
    return (
        f"python{python}-minimal", f"libpython{python}-minimal", f"libpython{python}-stdlib",
        f"libpython{python}-dev",
        "libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libexpat1", "libffi8", "libssl3",
        "libbz2-1.0", "liblzma5", "libcrypt1", "libsqlite3-0", "libuuid1", "libncursesw6", "libtinfo6",
        "libreadline8", "libdb5.3", "media-types",
    )


@dataclass(frozen=True)
class Sysroot:
    path: Path
    release: str
    arch: str          # the Debian architecture, e.g. arm64
    triple: str        # e.g. aarch64-linux-gnu
    python: str        # e.g. 3.11

    @property
    def python_exe(self) -> Path:
        """The board's interpreter inside the sysroot (an aarch64 ELF: run it through qemu -L)."""
        return self.path / "usr" / "bin" / f"python{self.python}"

    @property
    def python_include_dir(self) -> Path:
        """Python.h for the cross build, with the target's real pyconfig.h (not Debian's multiarch
        wrapper, which would need <sysroot>/usr/include on the compiler's include path)."""
        return self.path / "bmoe" / "include" / f"python{self.python}"

    @property
    def soabi(self) -> str:
        return f"cpython-{self.python.replace('.', '')}-{self.triple}"

    @property
    def stamp(self) -> dict[str, object]:
        return json.loads((self.path / STAMP_NAME).read_text())


def sysroot_dir(release: str, arch: str) -> Path:
    return cache_dir() / "sysroots" / f"{release}-{arch}"


def release_for(python: str) -> str:
    try:
        return DEBIAN_RELEASE_FOR_PYTHON[python]
    except KeyError:
        known = ", ".join(f"{v} ({r})" for v, r in DEBIAN_RELEASE_FOR_PYTHON.items())
        raise BmoeError(f"no board sysroot recipe for Python {python}; known: {known}") from None


def sysroot_for(profile_arch: str, python: str) -> Sysroot:
    """The (not necessarily existing) sysroot for a board's arch and Python."""
    if profile_arch not in DEBIAN_ARCH:
        raise BmoeError(f"no board sysroot for arch {profile_arch!r} (only {', '.join(DEBIAN_ARCH)})")
    arch, triple = DEBIAN_ARCH[profile_arch]
    release = release_for(python)
    return Sysroot(sysroot_dir(release, arch), release, arch, triple, python)


def _wanted_stamp(root: Sysroot) -> dict[str, object]:
    return {"format": SYSROOT_FORMAT, "release": root.release, "arch": root.arch,
            "python": root.python, "packages": list(_packages(root.python))}


def is_ready(root: Sysroot) -> bool:
    try:
        stamp, wanted = root.stamp, _wanted_stamp(root)
        return {k: stamp.get(k) for k in wanted} == wanted and root.python_exe.is_file()
    except (OSError, ValueError):
        return False


def _sources(release: str, arch: str) -> str:
    if not KEYRING.is_file():
        raise BmoeError(f"{KEYRING} is missing: install it with `apt-get install debian-archive-keyring`")
    main = os.environ.get(MIRROR_ENV, "http://deb.debian.org/debian")
    security = os.environ.get(SECURITY_MIRROR_ENV, "http://deb.debian.org/debian-security")
    opts = f"[arch={arch} signed-by={KEYRING}]"
    return (f"deb {opts} {main} {release} main\n"
            f"deb {opts} {main} {release}-updates main\n"
            f"deb {opts} {security} {release}-security main\n")


def _apt_options(state: Path, arch: str) -> list[str]:
    """A private apt: its own sources, lists, cache and (empty) dpkg status; nothing of the host's."""
    opts = {
        "Dir::Etc::SourceList": state / "sources.list",
        "Dir::Etc::SourceParts": state / "sources.list.d",
        "Dir::Etc::Preferences": state / "preferences",
        "Dir::Etc::PreferencesParts": state / "preferences.d",
        "Dir::State::Lists": state / "lists",
        "Dir::State::status": state / "status",
        "Dir::Cache": state / "cache",
        "APT::Architecture": arch,
        "APT::Architectures::": arch,
        # as root apt would drop to _apt, which cannot write our private directories
        "APT::Sandbox::User": getpass.getuser(),
    }
    args: list[str] = []
    for key, value in opts.items():
        args += ["-o", f"{key}={value}"]
    return args


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    if shutil.which(cmd[0]) is None:
        raise BmoeError(f"{cmd[0]} not found: the board sysroot needs Debian's apt and dpkg")
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = [ln for ln in (result.stderr + result.stdout).splitlines() if ln.strip()][-3:]
        raise BmoeError(f"{what} failed ({cmd[0]} exit {result.returncode}): {' | '.join(tail) or 'no output'}")


def _make_include_dir(root: Path, python: str, triple: str) -> None:
    src = root / "usr" / "include" / f"python{python}"
    real_config = root / "usr" / "include" / triple / f"python{python}" / "pyconfig.h"
    if not (src / "Python.h").is_file() or not real_config.is_file():
        raise BmoeError(f"libpython{python}-dev did not provide {src}/Python.h and {real_config}")
    dest = root / "bmoe" / "include" / f"python{python}"
    shutil.copytree(src, dest, symlinks=True)
    (dest / "pyconfig.h").unlink()
    shutil.copy2(real_config, dest / "pyconfig.h")


def ensure_sysroot(root: Sysroot, *, log: Callable[[str], None] | None = None) -> Sysroot:
    """Make `root` exist (download + unpack, ~20 MB, a few seconds); a no-op when its stamp matches."""
    if is_ready(root):
        return root
    say = log or (lambda _msg: None)
    packages = _packages(root.python)
    say(f"making the {root.release} {root.arch} sysroot at {root.path} ({len(packages)} Debian packages)")
    root.path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root.path.parent, prefix=f".{root.path.name}.new-"))
    try:
        state = staging / ".apt"
        for sub in ("sources.list.d", "preferences.d", "lists/partial", "cache/archives/partial", "debs"):
            (state / sub).mkdir(parents=True)
        (state / "sources.list").write_text(_sources(root.release, root.arch))
        (state / "status").write_text("")
        apt = ["apt-get", "-q", *_apt_options(state, root.arch)]
        _run([*apt, "update"], f"apt-get update ({root.release} {root.arch} package lists)")
        _run([*apt, "download", *packages], "apt-get download", cwd=state / "debs")
        debs = sorted((state / "debs").glob("*.deb"))
        if len(debs) != len(packages):
            raise BmoeError(f"apt-get download gave {len(debs)} packages, expected {len(packages)}")
        tree = staging / "root"
        for deb in debs:
            _run(["dpkg-deb", "-x", str(deb), str(tree)], f"unpacking {deb.name}")
        _make_include_dir(tree, root.python, root.triple)
        exe = tree / "usr" / "bin" / f"python{root.python}"
        if not exe.is_file():
            raise BmoeError(f"the packages did not provide {exe.relative_to(tree)}")
        versions = {d.name.split("_")[0]: d.name.split("_")[1] for d in debs}
        (tree / STAMP_NAME).write_text(json.dumps(_wanted_stamp(root) | {"versions": versions}, indent=2) + "\n")
        if root.path.exists():
            retired = Path(tempfile.mkdtemp(dir=root.path.parent, prefix=f".{root.path.name}.old-"))
            os.replace(root.path, retired / "old")
            shutil.rmtree(retired, ignore_errors=True)
        os.replace(tree, root.path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not is_ready(root):
        raise BmoeError(f"the sysroot at {root.path} is incomplete after unpacking")
    return root


def package_versions(root: Sysroot) -> dict[str, str]:
    """Debian package -> version, as unpacked (for the bundle manifest)."""
    try:
        return dict(root.stamp.get("versions", {}))  # type: ignore[arg-type]
    except (OSError, ValueError):
        return {}
