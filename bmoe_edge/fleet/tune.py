"""`bmoe-edge tune --host`: the board's current release measures the board (`tune --json --no-write`
there), and the profile it returns is written here and in the board's own user profile directory, both
only after the board's run succeeded and the profile resolved here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bmoe_edge.boards import profiles
from bmoe_edge.boards.tune import Progress, TuneResult, check_profile, commit, destination, quiet, staged
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.commands import tail
from bmoe_edge.fleet.onboard import run_release
from bmoe_edge.fleet.remote import SshOptions
from bmoe_edge.fleet.scripts import CONFIG_HOME
from bmoe_edge.fleet.state import connect, current_release
from bmoe_edge.fleet.targets import Target

REMOTE_TIMEOUT = 3600.0


def tune_args(board: str, *, model: str | None, scratch_dir: str | None, quick: bool) -> list[str]:
    """The board's `bmoe-edge tune` command line: measure only, the result as JSON."""
    return ["tune", "--board", board, "--json", "--no-write", *(["--quick"] if quick else []),
            *(["-m", model] if model else []), *(["--dir", scratch_dir] if scratch_dir else [])]


def tune_remote(target: Target, *, options: SshOptions, board: str | None = None, install_dir: str | None = None,
                model: str | None = None, scratch_dir: str | None = None, out: Path | None = None,
                quick: bool = False, progress: Progress = quiet) -> TuneResult:
    """Run the deployed release's `bmoe-edge tune` on the board, then write the profile it measured here
    and in the board's user profile directory (where its launcher finds it before the release's own)."""
    conn, layout = connect(target, options, board, install_dir)
    with conn:
        rid, rel, manifest = current_release(conn, layout)
        if board and board != manifest.board:
            raise BmoeError(f"{conn.label}: the deployed release is for board {manifest.board}, not {board}")
        name = manifest.board
        dest = destination(name, out)
        progress(f"tuning {conn.label} (board {name}, release {rid}) ...")
        args = tune_args(name, model=model, scratch_dir=scratch_dir, quick=quick)
        result = run_release(conn, rel, args, what="tune", timeout=REMOTE_TIMEOUT)
        if result.exited != 0:
            why = tail(result.stderr or result.stdout).removeprefix("error: ")
            if "No such command" in why:
                why += " (the deployed release predates `tune`: build and deploy again)"
            raise BmoeError(f"{conn.label}: tune failed: {why}")
        try:
            measured = TuneResult.from_json(result.stdout)
        except (ValueError, KeyError, TypeError) as exc:
            raise BmoeError(f"{conn.label}: tune printed no report ({exc}): {tail(result.stdout)}") from None
        text = measured.profile_yaml
        check_profile(text, dest.stem, dest.parent)
        home = conn.sh(CONFIG_HOME, what="finding ~/.config").stdout.strip()
        if not home.startswith("/"):
            raise BmoeError(f"{conn.label}: no home directory to write the profile in ({home!r})")
        board_dir = f"{home}/bmoe-edge/profiles"
        board_file = f"{board_dir}/{name}{profiles.SUFFIX}"
        with staged(dest, text) as tmp:
            conn.sh('mkdir -p -- "$1"', board_dir, what=f"creating {board_dir}")
            conn.write_bytes(board_file, text.encode())
            commit(tmp, dest)
    return replace(measured, where=conn.label, written=(str(dest), f"{conn.label}:{board_file}"))
