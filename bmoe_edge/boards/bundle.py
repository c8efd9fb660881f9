"""A board bundle (`dist/<board>/`) and its `manifest.json`: what was built, how, and every file's hash.

Layout of a bundle directory:

    manifest.json            this module's Manifest, as JSON (not listed in itself)
    manifest.json.sig        the build's OpenSSH signature of manifest.json (boards.signing; not listed)
    wheels/                  the board wheel (bmoe_edge-*-cp311-cp311-linux_aarch64.whl) and the
                             wheels of its runtime dependencies for the board's platform and Python
    launcher/                files from the checkout's deploy/ (bmoe-edge.sh: runs a release)
    fixtures/                the quick-gate models, generated on the host
    profile/<board>.yaml     the resolved board profile, read as it is on the board
                             (`BMOE_EDGE_PROFILES=<release>/profile`)

Rules that `verify_bundle` enforces: every file of the directory is listed in the manifest, with its
size and sha256; nothing unlisted; paths are relative POSIX paths inside the bundle (no absolute path,
no `..`, no symlink anywhere). The bundle id is `<board>-<version>-<12 hex>`, the hex being a hash of
the file list (the profile file included), so any change of content gives a new id.

Only the standard library (and BmoeError): the board itself can verify a bundle with this module.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import stat
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from bmoe_edge.errors import BmoeError
from bmoe_edge.llama_source import sha256_file

if TYPE_CHECKING:
    from bmoe_edge.boards.profiles import BoardProfile

FORMAT_VERSION = 2                 # 2: the profile is a file of the bundle, not a copy in the manifest
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.json.sig"   # the build's signature of manifest.json (boards.signing), optional
WHEELS_DIR = "wheels"
LAUNCHER_DIR = "launcher"
FIXTURES_DIR = "fixtures"
PROFILE_DIR = "profile"
LAUNCHER_SCRIPT = "launcher/bmoe-edge.sh"
HASH_CHARS = 12


@dataclass(frozen=True)
class FileEntry:
    path: str       # relative POSIX path inside the bundle
    size: int
    sha256: str


@dataclass(frozen=True)
class Fixture:
    """One quick-gate model: its tiny-model parameters and its file(s) (several for split models)."""

    arch: str
    quant: str
    split: int
    files: tuple[str, ...]   # bundle-relative paths, shard order


@dataclass(frozen=True)
class LlamaPin:
    version: str             # llama-cpp-python sdist version
    sha256: str              # sdist sha256
    upstream_commit: str
    patches: tuple[dict[str, str], ...]   # {"name", "sha256"}, in application order


@dataclass(frozen=True)
class Manifest:
    format_version: int
    bundle_id: str
    board: str
    arch: str                            # aarch64 | x86_64
    profile: str                         # bundle-relative path of the resolved profile (profile/<board>.yaml)
    python: str                          # the board Python the wheel is for, e.g. "3.11"
    glibc_required: str                  # highest GLIBC_x.y symbol version the binaries need
    needed_libs: tuple[str, ...]         # every NEEDED shared library of the binaries
    llama: LlamaPin
    compilers: dict[str, str]            # "c"/"cxx" -> `--version` first line
    cmake_flags: dict[str, str]          # every CMake flag that matters
    bmoe_edge_version: str
    wheel: str                           # bundle-relative path of the board wheel
    dependency_wheels: tuple[str, ...]   # bundle-relative paths of the runtime-dependency wheels
    launcher: str                        # bundle-relative path of the launcher script
    fixtures: tuple[Fixture, ...]
    files: tuple[FileEntry, ...] = field(repr=False)
    extra: dict[str, object] = field(default_factory=dict)   # free-form facts (build time, sysroot, ...)

    def file(self, path: str) -> FileEntry:
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)

    @property
    def wheels(self) -> tuple[str, ...]:
        """Every wheel to install into the release's site/, the board wheel first."""
        return (self.wheel, *self.dependency_wheels)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"


# ---------------------------------------------------------------------------------------------------


def profile_path(board: str) -> str:
    """Where a bundle (and a release on the board) keeps its resolved profile."""
    return f"{PROFILE_DIR}/{board}.yaml"


def check_relpath(path: str, what: str = "path") -> str:
    """A bundle path must be relative, normalized POSIX, inside the bundle; returns it unchanged."""
    p = PurePosixPath(path)
    if (not path or "\\" in path or "\0" in path or p.is_absolute() or path.startswith("/")
            or any(part in ("..", ".", "") for part in path.split("/"))):
        raise BmoeError(f"bundle {what} {path!r} is not a plain relative path inside the bundle "
                        "(absolute paths, '..', '.' and empty parts are refused)")
    return path


def content_hash(files: Iterable[FileEntry], profile: str) -> str:
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda e: e.path):
        digest.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
    digest.update(json.dumps(profile, sort_keys=True).encode())
    return digest.hexdigest()[:HASH_CHARS]


def make_bundle_id(board: str, version: str, files: Iterable[FileEntry], profile: str) -> str:
    return f"{board}-{version}-{content_hash(files, profile)}"


def _walk(bundle_dir: Path) -> list[str]:
    """Every file under bundle_dir (relative POSIX paths, sorted); refuses symlinks and special files."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(bundle_dir, followlinks=False):
        for name in [*dirnames, *filenames]:
            full = Path(dirpath) / name
            rel = full.relative_to(bundle_dir).as_posix()
            mode = full.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise BmoeError(f"bundle {bundle_dir}: {rel} is a symlink (bundles hold regular files only)")
            if name in filenames and not stat.S_ISREG(mode):
                raise BmoeError(f"bundle {bundle_dir}: {rel} is not a regular file")
            if name in filenames:
                out.append(rel)
    return sorted(out)


def scan_files(bundle_dir: Path) -> list[FileEntry]:
    """Size and sha256 of every file in the bundle except the manifest itself."""
    bundle_dir = Path(bundle_dir)
    return [FileEntry(rel, (bundle_dir / rel).stat().st_size, sha256_file(bundle_dir / rel))
            for rel in _walk(bundle_dir) if rel not in (MANIFEST_NAME, SIGNATURE_NAME)]


# ---------------------------------------------------------------------------------------------------


def write_manifest(
    bundle_dir: Path,
    *,
    board: str,
    arch: str,
    profile: str,
    python: str,
    glibc_required: str,
    needed_libs: Sequence[str],
    llama: LlamaPin,
    compilers: Mapping[str, str],
    cmake_flags: Mapping[str, str],
    bmoe_edge_version: str,
    wheel: str,
    dependency_wheels: Sequence[str],
    launcher: str = LAUNCHER_SCRIPT,
    fixtures: Sequence[Fixture] = (),
    extra: Mapping[str, object] | None = None,
) -> Manifest:
    """Hash every file now in `bundle_dir`, write `manifest.json` (atomically) and return it."""
    bundle_dir = Path(bundle_dir)
    files = tuple(scan_files(bundle_dir))
    listed = {f.path for f in files}
    for ref in [wheel, *dependency_wheels, launcher, profile, *(p for fx in fixtures for p in fx.files)]:
        check_relpath(ref)
        if ref not in listed:
            raise BmoeError(f"bundle {bundle_dir}: the manifest names {ref}, which is not in the bundle")
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        bundle_id=make_bundle_id(board, bmoe_edge_version, files, profile),
        board=board, arch=arch, profile=profile, python=python, glibc_required=glibc_required,
        needed_libs=tuple(needed_libs), llama=llama, compilers=dict(compilers),
        cmake_flags=dict(cmake_flags), bmoe_edge_version=bmoe_edge_version, wheel=wheel,
        dependency_wheels=tuple(dependency_wheels), launcher=launcher, fixtures=tuple(fixtures),
        files=files, extra=dict(extra or {}),
    )
    fd, tmp = tempfile.mkstemp(dir=bundle_dir, prefix=".manifest-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(manifest.to_json())
        os.chmod(tmp, 0o644)
        os.replace(tmp, bundle_dir / MANIFEST_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return manifest


def _need(data: Mapping[str, object], key: str, kind: type | tuple[type, ...], where: str) -> object:
    if key not in data:
        raise BmoeError(f"{where}: field '{key}' is missing")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BmoeError(f"{where}: field '{key}' has the wrong type ({type(value).__name__})")
    return value


def manifest_from_dict(data: Mapping[str, object], where: str = MANIFEST_NAME) -> Manifest:
    """Parse and type-check a manifest (relative-path rules included); BmoeError names the problem."""
    if not isinstance(data, dict):
        raise BmoeError(f"{where}: not a JSON object")
    version = _need(data, "format_version", int, where)
    if version != FORMAT_VERSION:
        raise BmoeError(f"{where}: format_version {version} is not {FORMAT_VERSION} (built by another "
                        "bmoe-edge version: rebuild the bundle)")
    files = []
    for i, item in enumerate(_need(data, "files", list, where)):  # type: ignore[arg-type]
        at = f"{where}: files[{i}]"
        if not isinstance(item, dict):
            raise BmoeError(f"{at}: not an object")
        path = str(_need(item, "path", str, at))
        check_relpath(path, f"file {at}")
        size = _need(item, "size", int, at)
        digest = str(_need(item, "sha256", str, at))
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise BmoeError(f"{at}: sha256 of {path} is not 64 lowercase hex digits")
        files.append(FileEntry(path, size, digest))  # type: ignore[arg-type]
    if len({f.path for f in files}) != len(files):
        raise BmoeError(f"{where}: a file is listed twice")
    llama = _need(data, "llama", dict, where)
    fixtures = []
    for i, fx in enumerate(_need(data, "fixtures", list, where)):  # type: ignore[arg-type]
        at = f"{where}: fixtures[{i}]"
        if not isinstance(fx, dict):
            raise BmoeError(f"{at}: not an object")
        fixtures.append(Fixture(str(_need(fx, "arch", str, at)), str(_need(fx, "quant", str, at)),
                                int(_need(fx, "split", int, at)),  # type: ignore[arg-type]
                                tuple(check_relpath(str(p), f"fixture {at}")
                                      for p in _need(fx, "files", list, at))))  # type: ignore[union-attr]
    # Words a deploy passes to the board before the signature is checked (the probe): plain by rule.
    if not re.fullmatch(r"[0-9]{1,2}\.[0-9]{1,3}", str(data.get("python", ""))):
        raise BmoeError(f"{where}: python {data.get('python')!r} is not a MAJOR.MINOR version")
    if not re.fullmatch(r"[a-z0-9_]{1,32}", str(data.get("arch", ""))):
        raise BmoeError(f"{where}: arch {data.get('arch')!r} is not a plain machine name")
    return Manifest(
        format_version=version,  # type: ignore[arg-type]
        bundle_id=str(_need(data, "bundle_id", str, where)),
        board=str(_need(data, "board", str, where)),
        arch=str(_need(data, "arch", str, where)),
        profile=check_relpath(str(_need(data, "profile", str, where)), "profile"),
        python=str(_need(data, "python", str, where)),
        glibc_required=str(_need(data, "glibc_required", str, where)),
        needed_libs=tuple(_need(data, "needed_libs", list, where)),  # type: ignore[arg-type]
        llama=LlamaPin(str(_need(llama, "version", str, where + ": llama")),  # type: ignore[arg-type]
                       str(_need(llama, "sha256", str, where + ": llama")),  # type: ignore[arg-type]
                       str(_need(llama, "upstream_commit", str, where + ": llama")),  # type: ignore[arg-type]
                       tuple(_need(llama, "patches", list, where + ": llama"))),  # type: ignore[arg-type]
        compilers=dict(_need(data, "compilers", dict, where)),  # type: ignore[arg-type]
        cmake_flags=dict(_need(data, "cmake_flags", dict, where)),  # type: ignore[arg-type]
        bmoe_edge_version=str(_need(data, "bmoe_edge_version", str, where)),
        wheel=check_relpath(str(_need(data, "wheel", str, where)), "wheel"),
        dependency_wheels=tuple(check_relpath(str(p), "wheel")
                                for p in _need(data, "dependency_wheels", list, where)),  # type: ignore[union-attr]
        launcher=check_relpath(str(_need(data, "launcher", str, where)), "launcher"),
        fixtures=tuple(fixtures),
        files=tuple(files),
        extra=dict(data.get("extra") or {}),  # type: ignore[call-overload]
    )


def read_manifest_bytes(bundle_dir: Path) -> bytes:
    """`<bundle_dir>/manifest.json` as bytes, read once: a deploy parses, hashes, verifies and uploads
    these same bytes, so swapping the file between those steps changes nothing they see."""
    path = Path(bundle_dir) / MANIFEST_NAME
    if path.is_symlink():
        raise BmoeError(f"{path} is a symlink (bundles hold regular files only)")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise BmoeError(f"{path} does not exist: {bundle_dir} is not a bundle (build one with "
                        "`bmoe-edge build --board NAME`)") from None
    except OSError as exc:
        raise BmoeError(f"{path}: cannot read the manifest: {exc.strerror}") from None


def parse_manifest(data: bytes, where: str = MANIFEST_NAME) -> Manifest:
    """Type-check a manifest's bytes (as read by read_manifest_bytes)."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BmoeError(f"{where}: cannot read the manifest: {exc}") from None
    return manifest_from_dict(parsed, where)


def load_manifest(bundle_dir: Path) -> Manifest:
    """Read and type-check `<bundle_dir>/manifest.json` (no file hashing: see verify_bundle)."""
    return parse_manifest(read_manifest_bytes(bundle_dir), str(Path(bundle_dir) / MANIFEST_NAME))


def bundle_profile(bundle_dir: Path, manifest: Manifest, *, checked: bool = False) -> BoardProfile:
    """The resolved profile a bundle was built with: its `profile/<board>.yaml`, read as it is.

    `checked`: the profile's bytes are read once and must have the manifest's sha256 (what a deploy
    uses: the file is not read again after it was hashed)."""
    # Imported here, not at the top: the rest of this module is the standard library only (verifying
    # a bundle needs no pyyaml); reading its profile does.
    from bmoe_edge.boards import profiles

    path = Path(bundle_dir) / manifest.profile
    if not checked:
        return profiles.load_profile_file(path, dirs=[])
    data = path.read_bytes()
    want = manifest.file(manifest.profile).sha256
    if hashlib.sha256(data).hexdigest() != want:
        raise BmoeError(f"bundle {bundle_dir}: {manifest.profile} does not match the manifest's sha256 "
                        f"({want[:16]}...): the file was changed")
    with tempfile.TemporaryDirectory(prefix="bmoe-profile-") as tmp:
        copy = Path(tmp) / PurePosixPath(manifest.profile).name
        copy.write_bytes(data)
        return profiles.load_profile_file(copy, dirs=[])


def verify_bundle(bundle_dir: Path, data: bytes | None = None) -> Manifest:
    """Check the whole bundle against its manifest; return the manifest, or raise BmoeError naming the file.

    `data`: the manifest's bytes as already read (read_manifest_bytes): checked, not read again.

    Every listed file is present, a regular file, with the listed size and sha256; no unlisted file;
    no symlink anywhere; every path relative and inside the bundle; the bundle id matches the content.
    """
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        raise BmoeError(f"bundle {bundle_dir} is not a directory")
    manifest = (load_manifest(bundle_dir) if data is None
                else parse_manifest(data, str(bundle_dir / MANIFEST_NAME)))
    present = set(_walk(bundle_dir)) - {MANIFEST_NAME, SIGNATURE_NAME}
    listed = {f.path: f for f in manifest.files}
    unlisted = sorted(present - set(listed))
    if unlisted:
        raise BmoeError(f"bundle {bundle_dir}: {unlisted[0]} is not listed in the manifest"
                        + (f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""))
    for entry in manifest.files:
        full = bundle_dir / entry.path
        if entry.path not in present:
            raise BmoeError(f"bundle {bundle_dir}: {entry.path} is listed in the manifest but missing")
        size = full.stat().st_size
        if size != entry.size:
            raise BmoeError(f"bundle {bundle_dir}: {entry.path} has {size} bytes, the manifest says {entry.size}")
        digest = sha256_file(full)
        if digest != entry.sha256:
            raise BmoeError(f"bundle {bundle_dir}: {entry.path} sha256 {digest[:16]}... does not match "
                            f"the manifest ({entry.sha256[:16]}...): the file was changed or corrupted")
    for ref in (*manifest.wheels, manifest.launcher, manifest.profile,
                *(p for fx in manifest.fixtures for p in fx.files)):
        if ref not in listed:
            raise BmoeError(f"bundle {bundle_dir}: the manifest names {ref}, which is not among its files")
    expected = make_bundle_id(manifest.board, manifest.bmoe_edge_version, manifest.files, manifest.profile)
    if manifest.bundle_id != expected:
        raise BmoeError(f"bundle {bundle_dir}: bundle_id {manifest.bundle_id} does not match its content "
                        f"({expected}): the manifest was edited")
    return manifest


# Caps on unpacking a bundle's wheels (site_digest on the machine that deploys, install_site), declared
# once: a zip bomb in dist/ is refused in one line instead of filling the disk. A host bundle's wheels
# hold ~30 MB in ~900 files, which deflate about 3:1 (measured on this checkout's venv, 2026-12);
# each cap is 30-50 times that.
MAX_UNPACKED_BYTES = 1 << 30      # what all of a bundle's wheels may unpack to, together
MAX_WHEEL_MEMBERS = 50_000        # members in all of them
MAX_WHEEL_RATIO = 100             # a wheel's unpacked size over its size on disk


def check_wheels(bundle_dir: Path, wheels: Sequence[str]) -> None:
    """Refuse (BmoeError, one line) wheels that are not zips or would unpack past the caps, from their
    central directories alone, before anything is unpacked. The declared sizes bound what unpacking
    writes: zipfile stops each member at its declared size (and checks its CRC)."""
    total = members = 0
    for wheel in wheels:
        path = Path(bundle_dir) / wheel
        try:
            with zipfile.ZipFile(path) as zf:
                infos = zf.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise BmoeError(f"bundle {bundle_dir}: {wheel} is not a zip (a wheel is one): {exc}") from None
        unpacked = sum(info.file_size for info in infos)
        total += unpacked
        members += len(infos)
        if members > MAX_WHEEL_MEMBERS:
            raise BmoeError(f"bundle {bundle_dir}: its wheels hold more than {MAX_WHEEL_MEMBERS} members "
                            f"({wheel} reaches {members}): refusing to unpack them")
        if total > MAX_UNPACKED_BYTES:
            raise BmoeError(f"bundle {bundle_dir}: its wheels would unpack to more than "
                            f"{MAX_UNPACKED_BYTES >> 20} MiB ({wheel} reaches {total >> 20} MiB): refusing to "
                            "unpack them")
        if unpacked > MAX_WHEEL_RATIO * max(path.stat().st_size, 1):
            raise BmoeError(f"bundle {bundle_dir}: {wheel} unpacks {unpacked} bytes from {path.stat().st_size}, "
                            f"a compression ratio above {MAX_WHEEL_RATIO} (a zip bomb?): refusing to unpack it")


def _unpack(bundle_dir: Path, wheels: Sequence[str], dest: Path) -> None:
    """Every wheel into dest (after check_wheels): a member whose data is damaged is a BmoeError too."""
    check_wheels(bundle_dir, wheels)
    for wheel in wheels:
        try:
            with zipfile.ZipFile(Path(bundle_dir) / wheel) as zf:
                for name in zf.namelist():
                    check_relpath(name.rstrip("/"), f"member of {wheel}")
                zf.extractall(dest)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
            raise BmoeError(f"bundle {bundle_dir}: {wheel} cannot be unpacked: {exc}") from None


def site_digest(bundle_dir: Path, wheels: Sequence[str]) -> str:
    """The sha256 of site/ once the bundle's wheels are unpacked (by its launcher: every wheel extracted,
    in name order), computed by unpacking them the same way (within the caps above): the sha256 of the
    bytewise-sorted `sha256sum` lines (`<hex>  ./<path>`) of every regular file outside __pycache__/.
    What deploy's board-side check (bmoe_edge/fleet/sh/site_hash.sh) prints for an intact site/."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="bmoe-site-") as tmp:
        _unpack(bundle_dir, sorted(wheels, key=lambda w: posixpath.basename(w).encode()), Path(tmp))
        root = Path(tmp)
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and "__pycache__" not in path.relative_to(root).parts:
                rel = "./" + path.relative_to(root).as_posix()
                lines.append((rel.encode(), f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {rel}\n"))
    return hashlib.sha256("".join(text for _key, text in sorted(lines)).encode()).hexdigest()


def install_site(bundle_dir: Path, site_dir: Path, manifest: Manifest | None = None) -> Path:
    """Unpack every wheel of the bundle into `site_dir` (what PYTHONPATH points at on the board).

    A wheel is a zip whose top level is import-ready, so unpacking is an install for pure and platlib
    wheels alike (no scripts are needed: the launcher runs `python -m bmoe_edge`). Returns site_dir.
    """
    bundle_dir = Path(bundle_dir)
    manifest = manifest or load_manifest(bundle_dir)
    site_dir = Path(site_dir)
    site_dir.mkdir(parents=True, exist_ok=True)
    _unpack(bundle_dir, manifest.wheels, site_dir)
    return site_dir
