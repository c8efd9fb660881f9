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
  still on the board or `--allow-downgrade`.
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
    raw = board.read_bytes(path)
    lines = [ln for ln in (raw or b"").decode("utf-8", "replace").splitlines() if ln.strip()]
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
                        "before uploading): refusing it (a manifest changed after it was signed, or a key the "
                        "board does not trust: --trust-key FILE.pub)")
    return True


def check_not_older(board: Board, layout: Layout, b: LocalBundle, current: str | None, on_board: bool,
                    options: TrustOptions) -> None:
    """An old signed bundle replayed over a newer current release is refused: a validly signed release
    with a known hole must not come back by someone copying it into dist/. Going back is `rollback` (to
    a release still on the board), or --allow-downgrade. Releases already on the board were verified
    when they came: deploying one again is a rollback and allowed."""
    mine = b.manifest.extra.get("built_at")
    if options.allow_downgrade or on_board or current is None or current == b.manifest.bundle_id \
            or not isinstance(mine, str):
        return
    raw = board.read_bytes(f"{layout.release(current)}/{bundle.MANIFEST_NAME}")
    try:
        theirs = bundle.parse_manifest(raw or b"").extra.get("built_at")
    except BmoeError:
        return      # a release from before build times were recorded: nothing to compare with
    if isinstance(theirs, str) and mine < theirs:
        raise BmoeError(f"{board.label}: bundle {b.manifest.bundle_id} was built {mine}, before the current "
                        f"release {current} ({theirs}): refusing an older bundle over a newer one "
                        "(`bmoe-edge rollback` goes back to a release kept on the board; --allow-downgrade "
                        "deploys it anyway)")


def verify_signature(board: Board, layout: Layout, rel: str) -> None:
    """On the board: the release's manifest is signed by a key of allowed_signers."""
    result = board.sh(SIG_VERIFY, f"{layout.install_dir}/{ALLOWED}", rel, what="verifying the bundle's signature",
                      check=False)
    if result.exited == 15:     # the signature holds, but for another bundle than this release
        raise BmoeError(f"{board.label}: {tail(result.stderr or result.stdout)}")
    if result.exited != 0:
        raise BmoeError(f"{board.label}: the bundle's signature does not verify against "
                        f"{layout.install_dir}/{ALLOWED} ({tail(result.stderr or result.stdout)}): refusing "
                        "it (a manifest changed after it was signed, or a key the board does not trust: "
                        "--trust-key FILE.pub)")
