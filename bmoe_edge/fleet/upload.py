"""Uploading a release: files already on the board are kept, files another release has are copied
there, the rest uploaded; then every file verified with sha256sum."""

from __future__ import annotations

import hashlib
import posixpath
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bmoe_edge.boards import bundle
from bmoe_edge.boards.profiles import BoardProfile
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.commands import Board
from bmoe_edge.fleet.report import HostResult, Log, say
from bmoe_edge.fleet.scripts import COPY, HASH, MKDIRS, REMOVE_IN, SCAN, SITE_HASH
from bmoe_edge.fleet.state import MARKS, SITE_FACTOR, Hooks, Layout, Releases, inside
from bmoe_edge.fleet.targets import check_name
from bmoe_edge.units import size_text


def hash_remote(board: Board, base: str, paths: Sequence[str], what: str) -> dict[str, str | None]:
    """sha256 of each path under base on the board (None: missing or not a regular file)."""
    out: dict[str, str | None] = dict.fromkeys(paths)
    if not paths:
        return out
    result = board.sh(HASH, base, *(bundle.check_relpath(p) for p in paths), what=what)
    for line in result.stdout.splitlines():
        idx, _, digest = line.partition(" ")
        if idx.isdigit() and int(idx) < len(paths) and re.fullmatch(r"[0-9a-f]{64}", digest):
            out[paths[int(idx)]] = digest
    return out


def scan_release(board: Board, rel: str) -> tuple[str | None, list[str]]:
    """(first symlink in the release or None, every file outside site*)."""
    result = board.sh(SCAN, rel, what=f"scanning {rel}")
    parts = [p for p in result.stdout.split("\0") if p]
    if parts[:1] == ["SYMLINK"]:
        return (parts[1] if len(parts) > 1 else "?"), []
    return None, [p[2:] if p.startswith("./") else p for p in parts]


def expected_files(manifest: bundle.Manifest, manifest_sha: str, signature_sha: str | None = None) -> dict[str, str]:
    files = {f.path: f.sha256 for f in manifest.files}
    files[bundle.MANIFEST_NAME] = manifest_sha
    if signature_sha is not None:
        files[bundle.SIGNATURE_NAME] = signature_sha
    return files


def verify_release(board: Board, rel: str, manifest: bundle.Manifest, manifest_sha: str,
                   signature_sha: str | None = None) -> None:
    """Every file of the release on the board has the bundle's sha256; no symlink, nothing unlisted
    (the signature, when not given, may be there: it is checked against allowed_signers instead)."""
    expected = expected_files(manifest, manifest_sha, signature_sha)
    link, present = scan_release(board, rel)
    if link is not None:
        raise BmoeError(f"{board.label}: {rel} contains a symlink ({link!r}): refusing it")
    unlisted = sorted(set(present) - set(expected) - set(MARKS) - {bundle.SIGNATURE_NAME})
    if unlisted:
        raise BmoeError(f"{board.label}: {rel} holds {unlisted[0]!r}, which is not in the bundle: refusing it")
    hashes = hash_remote(board, rel, list(expected), f"verifying {rel}")
    for path, want in expected.items():
        got = hashes[path]
        if got != want:
            state = "is missing" if got is None else f"has sha256 {got[:16]}..., the bundle says {want[:16]}..."
            raise BmoeError(f"{board.label}: {path} on the board {state}: refusing the release")


def board_site_digest(board: Board, rel: str) -> str:
    """sha256 of a release's site/ tree on the board (sh/site_hash.sh); BmoeError for a symlink or none."""
    out = board.sh(SITE_HASH, rel, what=f"hashing {rel}/site", timeout=1800).stdout.strip()
    if out.startswith("site ") and re.fullmatch(r"[0-9a-f]{64}", out[5:]):
        return out[5:]
    if out.startswith("symlink "):
        raise BmoeError(f"{board.label}: {rel}/site contains a symlink ({out[8:]!r}): refusing the release")
    raise BmoeError(f"{board.label}: {rel}/site is missing: deploy the release again")


def verify_site(board: Board, rel: str, want: str | None) -> None:
    """site/ (on the release's PYTHONPATH) is what its wheels unpack to; `want` None: nothing recorded
    (a release installed by an older bmoe-edge): not checked."""
    if want is None:
        return
    got = board_site_digest(board, rel)
    if got != want:
        raise BmoeError(f"{board.label}: {rel}/site does not match the bundle's wheels (sha256 {got[:16]}..., "
                        f"installed as {want[:16]}...): refusing it (deploy the bundle again to repair it)")


# ---------------------------------------------------------------------------------------------------
# Deploy one host.


@dataclass
class LocalBundle:
    """A verified bundle on this machine, about to be deployed."""

    dir: Path
    manifest: bundle.Manifest
    manifest_sha: str
    profile: BoardProfile     # its resolved profile (profile/<board>.yaml): login and emulation facts
    signature_sha: str | None = None   # sha256 of manifest.json.sig, when the bundle is signed
    _site: str | None = None
    _site_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # The manifest and its signature as read once (load_bundle): these bytes are what was parsed and
    # hashed, what is verified here and what is uploaded; the files on disk are not read again.
    manifest_bytes: bytes = field(default=b"", repr=False)
    signature_bytes: bytes | None = field(default=None, repr=False)

    def signed_bytes(self, name: str) -> bytes:
        """manifest.json or manifest.json.sig, as read once."""
        data = self.manifest_bytes if name == bundle.MANIFEST_NAME else self.signature_bytes
        if data is None:
            raise BmoeError(f"bundle {self.dir} has no {name}")
        return data

    @property
    def site_sha256(self) -> str:
        """The sha256 of site/ once installed: the manifest's (the build writes it, the signature covers
        it), else computed from the wheels (bundle.site_digest: unpacked within its caps), once for all
        hosts. Deploy asks only once the signature held (or --allow-unsigned vouched for the bundle):
        nothing of an unchecked bundle is unpacked here."""
        with self._site_lock:
            if self._site is None:
                signed = self.manifest.extra.get("site_sha256")
                self._site = signed if isinstance(signed, str) else bundle.site_digest(self.dir, self.manifest.wheels)
            return self._site


def upload(board: Board, b: LocalBundle, layout: Layout, releases: Releases, result: HostResult, log: Log,
            hooks: Hooks) -> None:
    m = b.manifest
    partial = layout.partial(m.bundle_id)
    expected = expected_files(m, b.manifest_sha, b.signature_sha)
    board.sh("mkdir -p -- \"$1\"", partial, what=f"creating {partial}")
    link, present = scan_release(board, partial)
    if link is not None:
        raise BmoeError(f"{board.label}: {partial} contains a symlink ({link!r}): remove it, then deploy again")
    stray = sorted(set(present) - set(expected))
    if stray:
        board.sh(REMOVE_IN, partial, *stray, what="removing stray files")
    paths = sorted(expected)
    have = hash_remote(board, partial, paths, "checking what is already on the board")
    missing = [p for p in paths if have[p] != expected[p]]
    result.files = len(paths)
    result.files_present = len(paths) - len(missing)
    # files another release on the board already has: copy them there instead of uploading
    sizes = {f.path: f.size for f in m.files}
    sizes[bundle.MANIFEST_NAME] = len(b.manifest_bytes)
    if b.signature_bytes is not None:
        sizes[bundle.SIGNATURE_NAME] = len(b.signature_bytes)
    copies: dict[str, list[str]] = {}
    remaining = [p for p in missing if p not in (bundle.MANIFEST_NAME, bundle.SIGNATURE_NAME)]
    newest_first = releases.newest_first()
    sources = [r for r in ([releases.current] if releases.current in releases.complete else [])
               + [r for r in newest_first if r != releases.current] if r != m.bundle_id]
    for rid in sources:
        if not remaining:
            break
        found = hash_remote(board, layout.release(rid), remaining, f"looking for unchanged files in {rid}")
        hits = [p for p in remaining if found[p] == expected[p]]
        if hits:
            copies[rid] = hits
            remaining = [p for p in remaining if p not in hits]
    copied = {p for hits in copies.values() for p in hits}
    upload = [p for p in missing if p not in copied]
    need = sum(sizes[p] for p in missing) + SITE_FACTOR * sum(sizes[w] for w in m.wheels)
    if releases.avail_kb is not None and releases.avail_kb * 1024 < need:
        raise BmoeError(f"{board.label}: not enough space in {layout.install_dir}: the release needs about "
                        f"{size_text(need)}, {size_text(releases.avail_kb * 1024)} is free "
                        "(lower --keep, or free space)")
    dirs = sorted({posixpath.dirname(p) for p in missing if "/" in p})
    if dirs:
        board.sh(MKDIRS, partial, *dirs, what="creating directories")
    for rid, hits in copies.items():
        board.sh(COPY, layout.release(rid), partial, *hits, what=f"copying unchanged files from {rid}")
        result.files_copied += len(hits)
    if copies:
        say(log, board.label, f"copied {result.files_copied} unchanged files from "
             f"{', '.join(copies)} on the board")
    if upload:
        total = sum(sizes[p] for p in upload)
        say(log, board.label, f"uploading {len(upload)} files ({size_text(total)})")
        signed = [p for p in upload if p in (bundle.MANIFEST_NAME, bundle.SIGNATURE_NAME)]
        for p in signed:    # the bytes read once (and verified), not the file again
            board.write_bytes(inside(partial, p), b.signed_bytes(p), 0o644, durable=False)
        files = [bundle.check_relpath(p) for p in upload if p not in signed]
        if files:
            board.put_files(b.dir, files, partial)
        result.files_uploaded += len(upload)
        result.bytes_uploaded += total
    else:
        say(log, board.label, "nothing to upload: every file is already on the board")
    if "uploaded" in hooks:
        hooks["uploaded"](partial)
    say(log, board.label, f"verifying {len(paths)} files on the board (sha256sum)")
    verify_release(board, partial, m, b.manifest_sha, b.signature_sha)


def load_bundle(bundle_dir: Path) -> LocalBundle:
    """The bundle, verified: its manifest read once, as bytes (parsed, hashed, later verified and
    uploaded from those bytes), every file checked against it, its profile read once and checked."""
    bundle_dir = Path(bundle_dir)
    data = bundle.read_manifest_bytes(bundle_dir)
    manifest = bundle.verify_bundle(bundle_dir, data)
    check_name(manifest.bundle_id, "bundle id")
    check_name(manifest.board, "board")
    sig = bundle_dir / bundle.SIGNATURE_NAME
    if sig.is_symlink():
        raise BmoeError(f"{sig} is a symlink (bundles hold regular files only)")
    signature = sig.read_bytes() if sig.is_file() else None
    return LocalBundle(bundle_dir, manifest, hashlib.sha256(data).hexdigest(),
                       bundle.bundle_profile(bundle_dir, manifest, checked=True),
                       hashlib.sha256(signature).hexdigest() if signature is not None else None,
                       manifest_bytes=data, signature_bytes=signature)
