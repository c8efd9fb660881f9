"""Which bundles a board accepts: `<install_dir>/allowed_signers` lists the keys it trusts; a bundle's
manifest.json.sig (boards.signing) must verify against it — on the board, with `ssh-keygen -Y verify` —
before anything of it is installed.

- The first deploy to a board provisions the file: with the key of `--trust-key FILE.pub`, else (trust
  on first use) the key this machine signs with, when the bundle carries a valid signature by it.
- Later deploys refuse an unsigned bundle (unless `--allow-unsigned`), and always one whose signature
  does not verify (a manifest edited and re-hashed but not re-signed, another builder's key): checked
  here first, on the bytes about to be uploaded, then on the board by the board itself (which also
  checks that the signed manifest's bundle_id is the release directory's name).
- A bundle built before the current release is refused (an old signed bundle replayed), unless it is
  still on the board or `--allow-downgrade`; so is one whose age cannot be compared (a signed bundle
  without `built_at`, a current release without one).
- `rollback` checks the signature of the release it switches back to (the board's copy of it) where
  the board trusts keys.
- A board this checkout has no profile of: the bundle's profile picks the login and the install dir
  only once its signature holds here (this machine's key, or --trust-key), before connecting.
- `--trust-key` on a later deploy adds a key (a new build machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.boards import bundle, signing
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.commands import Board, tail
from bmoe_edge.fleet.report import Log, say
from bmoe_edge.fleet.scripts import SIG_VERIFY
from bmoe_edge.fleet.state import Layout
from bmoe_edge.fleet.upload import LocalBundle

ALLOWED = "allowed_signers"
# how a signature that does not hold is refused, and what to do about it
REFUSING = ("refusing it (a manifest changed after it was signed, or a key the board does not trust: "
            "--trust-key FILE.pub)")


@dataclass(frozen=True)
class TrustOptions:
    trust_key: Path | None = None     # a public key file to add to the board's allowed_signers
    allow_unsigned: bool = False      # an unsigned bundle may come in (a signed one is still checked)
    allow_downgrade: bool = False     # a bundle built before the current release may replace it


def _public(path: Path) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise BmoeError(f"--trust-key {path}: {exc.strerror}") from None


def check_trust(board: Board, layout: Layout, b: LocalBundle, options: TrustOptions, log: Log) -> bool:
    """Under the board lock, before any upload: provision allowed_signers if asked (or on first use),
    refuse what the board must not take, and check the signature here, against the keys the board
    trusts, on the very bytes that will be uploaded. True: verify it on the board too."""
    path = f"{layout.install_dir}/{ALLOWED}"
    lines = trusted_keys(board, layout)
    sig = b.signature_bytes
    signed = sig is not None
    add: list[str] = []
    own = signing.existing_public_key()
    if options.trust_key is not None:
        add.append(signing.allowed_signers_line(_public(options.trust_key)))
    elif not lines and signed and own and signing.verifies_bytes(b.manifest_bytes, sig or b"",
                                                                  [signing.allowed_signers_line(own)]):
        add.append(signing.allowed_signers_line(own))   # trust on first use: the key this machine builds with
    new = [ln for ln in add if ln not in lines]
    if new:
        lines += new
        board.sh('mkdir -p -- "$1"', layout.install_dir, what=f"creating {layout.install_dir}")
        board.write_bytes(path, ("\n".join(lines) + "\n").encode(), 0o644)
        say(log, board.label, f"{path}: now trusts {', '.join(ln.split()[-1][:24] + '...' for ln in new)}")
    if options.allow_unsigned and (not signed or not lines):
        # --allow-unsigned lets an *unsigned* bundle in; a signed one is still checked where the board
        # trusts a key (a bad signature is a forgery, not a missing one)
        say(log, board.label, "not checking the bundle's signature (--allow-unsigned)")
        return False
    if not lines:
        raise BmoeError(f"{board.label}: the board trusts no bundle signing key yet ({path}) and bundle "
                        f"{b.manifest.bundle_id} is not signed by this machine's key: deploy with --trust-key "
                        "FILE.pub (the builder's key), or --allow-unsigned")
    if not signed:
        raise BmoeError(f"{board.label}: bundle {b.manifest.bundle_id} is not signed (no {signing.SIGNATURE_NAME}; "
                        "`bmoe-edge build` signs): refusing it (--allow-unsigned to deploy it anyway)")
    if not signing.verifies_bytes(b.manifest_bytes, sig or b"", lines):
        raise BmoeError(f"{board.label}: the bundle's signature does not verify against {path} (checked "
                        f"before uploading): {REFUSING}")
    return True


def built_at(manifest: bundle.Manifest) -> str | None:
    """When the bundle was built (`extra.built_at`, written by `bmoe-edge build` under the signature)."""
    value = manifest.extra.get("built_at")
    return value if isinstance(value, str) and value else None


def check_not_older(board: Board, layout: Layout, b: LocalBundle, current: str | None, on_board: bool,
                    options: TrustOptions) -> None:
    """An old signed bundle replayed over a newer current release is refused: a validly signed release
    with a known hole must not come back by someone copying it into dist/. Going back is `rollback` (to
    a release still on the board), or --allow-downgrade. Releases already on the board were verified
    when they came: deploying one again is a rollback and allowed. What cannot be compared is refused
    too, never let through: a signed bundle without a build time (one from before build times were
    recorded is older than anything with one), or any bundle over a current release without one."""
    if options.allow_downgrade or on_board or current == b.manifest.bundle_id:
        return
    mine = built_at(b.manifest)
    if mine is None and b.signature_bytes is not None:
        raise BmoeError(f"{board.label}: bundle {b.manifest.bundle_id} is signed but records no build time "
                        "(extra.built_at, which `bmoe-edge build` writes under the signature): it cannot be "
                        "checked for a downgrade, refusing it (--allow-downgrade deploys it anyway)")
    if current is None:
        return
    raw = board.read_bytes(f"{layout.release(current)}/{bundle.MANIFEST_NAME}")
    try:
        theirs = built_at(bundle.parse_manifest(raw or b""))
    except BmoeError:
        theirs = None
    if mine is None or theirs is None:
        which = f"bundle {b.manifest.bundle_id}" if mine is None else f"the current release {current}"
        raise BmoeError(f"{board.label}: {which} records no build time (extra.built_at): cannot tell whether "
                        f"{b.manifest.bundle_id} is older than {current}, refusing it (--allow-downgrade "
                        "deploys it anyway; later deploys compare with its build time)")
    if mine < theirs:
        raise BmoeError(f"{board.label}: bundle {b.manifest.bundle_id} was built {mine}, before the current "
                        f"release {current} ({theirs}): refusing an older bundle over a newer one "
                        "(`bmoe-edge rollback` goes back to a release kept on the board; --allow-downgrade "
                        "deploys it anyway)")


def verify_signature(board: Board, layout: Layout, rel: str, refusing: str = REFUSING) -> None:
    """On the board: the release's manifest is signed by a key of allowed_signers."""
    result = board.sh(SIG_VERIFY, f"{layout.install_dir}/{ALLOWED}", rel, what="verifying the bundle's signature",
                      check=False)
    if result.exited == 15:     # the signature holds, but for another bundle than this release
        raise BmoeError(f"{board.label}: {tail(result.stderr or result.stdout)}")
    if result.exited != 0:
        raise BmoeError(f"{board.label}: the bundle's signature does not verify against "
                        f"{layout.install_dir}/{ALLOWED} ({tail(result.stderr or result.stdout)}): {refusing}")


def trusted_keys(board: Board, layout: Layout) -> list[str]:
    """The lines of the board's allowed_signers (none: the board was never told to trust a key)."""
    raw = board.read_bytes(f"{layout.install_dir}/{ALLOWED}")
    return [ln for ln in (raw or b"").decode("utf-8", "replace").splitlines() if ln.strip()]


def check_rollback_target(board: Board, layout: Layout, release_id: str) -> None:
    """Before `rollback` switches to a release kept on the board: where the board trusts keys, that
    release (the board's copy, which anyone who can write there could have changed) must still carry a
    signature by one of them, of its own bundle id. Nothing is switched otherwise."""
    if not trusted_keys(board, layout):
        return
    verify_signature(board, layout, layout.release(release_id),
                     f"refusing to roll back to {release_id}, nothing switched (a release changed on the board, "
                     "or deployed unsigned: deploy a signed bundle instead)")


def signed_here(b: LocalBundle, options: TrustOptions) -> bool:
    """Whether the bundle's signature holds here, before connecting, by a key this machine vouches for:
    its own signing key or --trust-key's. Only then may the bundle's own profile choose how a board
    this checkout has no profile of is reached (its login and install dir)."""
    keys = [key for key in (signing.existing_public_key(),
                            _public(options.trust_key) if options.trust_key is not None else None) if key]
    return b.signature_bytes is not None and bool(keys) and signing.verifies_bytes(
        b.manifest_bytes, b.signature_bytes, [signing.allowed_signers_line(key) for key in keys])
