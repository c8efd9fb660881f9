"""Signing bundles: `build` signs a bundle's manifest.json (which holds every file's sha256) with an
OpenSSH key, `ssh-keygen -Y sign`, into manifest.json.sig beside it. Boards check it with `ssh-keygen -Y
verify` against the keys they were told to trust (`deploy --trust-key`): nothing new on a board that
has the OpenSSH client.

The key is made on first use: `${XDG_CONFIG_HOME:-~/.config}/bmoe-edge/signing/bundle_ed25519` (a
private 0700 directory; no passphrase — keep the machine that builds safe), or `$BMOE_EDGE_SIGNING_KEY`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from bmoe_edge.errors import BmoeError

NAMESPACE = "bmoe-edge-bundle"      # what a signature is for (ssh-keygen -n): not a login, not git
PRINCIPAL = "bmoe-edge"             # the identity in a board's allowed_signers
SIGNATURE_NAME = "manifest.json.sig"
KEY_ENV = "BMOE_EDGE_SIGNING_KEY"


def key_path() -> Path:
    env = os.environ.get(KEY_ENV)
    if env:
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "bmoe-edge" / "signing" / "bundle_ed25519"


def _keygen() -> str:
    found = shutil.which("ssh-keygen")
    if found is None:
        raise BmoeError("ssh-keygen not found (bundles are signed with it): apt-get install openssh-client")
    return found


def ensure_key(path: Path | None = None) -> Path:
    """The signing key, made (ed25519, in a 0700 directory) when there is none yet."""
    path = path or key_path()
    if path.is_file() and path.with_name(path.name + ".pub").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    path.unlink(missing_ok=True)
    comment = f"bmoe-edge bundle signing key ({os.environ.get('USER', 'user')}@{socket.gethostname()})"
    result = subprocess.run([_keygen(), "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise BmoeError(f"cannot make the signing key {path}: {result.stderr.strip()}")
    return path


def public_key(path: Path | None = None) -> str:
    """`ssh-ed25519 AAAA… comment` of the (made if missing) signing key."""
    key = ensure_key(path)
    return key.with_name(key.name + ".pub").read_text(encoding="utf-8").strip()


def existing_public_key() -> str | None:
    """This machine's signing public key, if it has made one (never makes one)."""
    pub = key_path().with_name(key_path().name + ".pub")
    try:
        return pub.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def allowed_signers_line(public: str) -> str:
    """One allowed_signers line trusting `public` (an OpenSSH public key line) for bundles only."""
    words = public.split()
    if len(words) < 2 or not words[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise BmoeError(f"not an OpenSSH public key: {public[:60]!r}")
    return f'{PRINCIPAL} namespaces="{NAMESPACE}" {words[0]} {words[1]}'


def sign_bundle(bundle_dir: Path, key: Path | None = None) -> Path:
    """Sign bundle_dir/manifest.json; returns the signature file."""
    key = ensure_key(key)
    manifest = Path(bundle_dir) / "manifest.json"
    sig = Path(bundle_dir) / SIGNATURE_NAME
    sig.unlink(missing_ok=True)
    result = subprocess.run([_keygen(), "-q", "-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(manifest)],
                            capture_output=True, text=True)
    if result.returncode != 0 or not sig.is_file():
        raise BmoeError(f"signing {manifest} with {key} failed: {result.stderr.strip() or result.stdout.strip()}")
    return sig


def verifies(bundle_dir: Path, public: str) -> bool:
    """Whether bundle_dir's manifest.json.sig is a valid signature by `public` (checked here)."""
    sig = Path(bundle_dir) / SIGNATURE_NAME
    if not sig.is_file():
        return False
    return verifies_bytes((Path(bundle_dir) / "manifest.json").read_bytes(), sig.read_bytes(),
                          [allowed_signers_line(public)])


def verifies_bytes(manifest: bytes, signature: bytes, allowed: Sequence[str]) -> bool:
    """Whether `signature` is a valid bundle signature of `manifest` by a key of `allowed` (lines of an
    allowed_signers file, as a board keeps them): the same check the board makes, made here first on
    the very bytes that will be uploaded."""
    import tempfile

    lines = [ln for ln in allowed if ln.strip()]
    if not lines or not signature:
        return False
    with tempfile.TemporaryDirectory(prefix="bmoe-verify-") as tmp:
        allowed_file, sig_file = Path(tmp) / "allowed_signers", Path(tmp) / SIGNATURE_NAME
        allowed_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
        sig_file.write_bytes(signature)
        result = subprocess.run([_keygen(), "-Y", "verify", "-f", str(allowed_file), "-I", PRINCIPAL, "-n",
                                 NAMESPACE, "-s", str(sig_file)], input=manifest, capture_output=True)
    return result.returncode == 0
