"""Which bundles a board accepts: `<install_dir>/allowed_signers` lists the keys it trusts; a bundle's
manifest.json.sig (boards.signing) must verify against it — on the board, with `ssh-keygen -Y verify` —
before anything of it is installed.

- The first deploy to a board provisions the file: with the key of `--trust-key FILE.pub`, else (trust
  on first use) the key this machine signs with, when the bundle carries a valid signature by it.
- Later deploys refuse an unsigned bundle, or one whose signature does not verify (a manifest edited
  and re-hashed but not re-signed, another builder's key), unless `--allow-unsigned`.
- `--trust-key` on a later deploy adds a key (a new build machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.boards import signing
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
    allow_unsigned: bool = False


def _public(path: Path) -> str:
    try:
        return Path(path).expanduser().read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise BmoeError(f"--trust-key {path}: {exc.strerror}") from None


def check_trust(board: Board, layout: Layout, b: LocalBundle, options: TrustOptions, log: Log) -> bool:
    """Under the board lock, before any upload: provision allowed_signers if asked (or on first use),
    refuse what the board must not take. True: verify the bundle's signature on the board."""
    path = f"{layout.install_dir}/{ALLOWED}"
    raw = board.read_bytes(path)
    lines = [ln for ln in (raw or b"").decode("utf-8", "replace").splitlines() if ln.strip()]
    signed = (b.dir / signing.SIGNATURE_NAME).is_file()
    add: list[str] = []
    own = signing.existing_public_key()
    if options.trust_key is not None:
        add.append(signing.allowed_signers_line(_public(options.trust_key)))
    elif not lines and signed and own and signing.verifies(b.dir, own):
        add.append(signing.allowed_signers_line(own))   # trust on first use: the key this machine builds with
    new = [ln for ln in add if ln not in lines]
    if new:
        lines += new
        board.sh('mkdir -p -- "$1"', layout.install_dir, what=f"creating {layout.install_dir}")
        board.write_bytes(path, ("\n".join(lines) + "\n").encode(), 0o644)
        say(log, board.label, f"{path}: now trusts {', '.join(ln.split()[-1][:24] + '...' for ln in new)}")
    if options.allow_unsigned:
        if not signed or not lines:
            say(log, board.label, "not checking the bundle's signature (--allow-unsigned)")
        return False
    if not lines:
        raise BmoeError(f"{board.label}: the board trusts no bundle signing key yet ({path}) and bundle "
                        f"{b.manifest.bundle_id} is not signed by this machine's key: deploy with --trust-key "
                        "FILE.pub (the builder's key), or --allow-unsigned")
    if not signed:
        raise BmoeError(f"{board.label}: bundle {b.manifest.bundle_id} is not signed (no {signing.SIGNATURE_NAME}; "
                        "`bmoe-edge build` signs): refusing it (--allow-unsigned to deploy it anyway)")
    return True


def verify_signature(board: Board, layout: Layout, rel: str) -> None:
    """On the board: the release's manifest is signed by a key of allowed_signers."""
    result = board.sh(SIG_VERIFY, f"{layout.install_dir}/{ALLOWED}", rel, what="verifying the bundle's signature",
                      check=False)
    if result.exited != 0:
        raise BmoeError(f"{board.label}: the bundle's signature does not verify against "
                        f"{layout.install_dir}/{ALLOWED} ({tail(result.stderr or result.stdout)}): refusing "
                        "it (a manifest changed after it was signed, or a key the board does not trust: "
                        "--trust-key FILE.pub)")
