"""`bmoe-edge rollback` and `status`: switch `current` back (after verifying it), or report it."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.remote import SshOptions, Target
from bmoe_edge.fleet.scripts import SWITCH
from bmoe_edge.fleet.state import (
    Install,
    Log,
    now,
    opened,
    read_gates,
    release_manifest,
    write_pointer,
    write_state,
)
from bmoe_edge.fleet.table import HostResult, run_fleet, stderr_log
from bmoe_edge.fleet.upload import say, verify_release


def _previous(install: Install) -> str:
    """The release to roll back to: the one state.json records, else the newest other complete one."""
    releases, state = install.releases, install.state
    current = releases.current
    previous = state.get("previous") if state.get("bundle_id") == current else None
    if not isinstance(previous, str) or previous not in releases.complete or previous == current:
        older = [r for r in releases.newest_first() if r != current]
        previous = older[0] if older else None
    if previous is None:
        raise BmoeError(f"{install.board.label}: no previous release in {install.layout.install_dir} to roll "
                        f"back to (current: {current})")
    return previous


def rollback_host(target: Target, *, options: SshOptions, board_name: str | None = None,
                  install_dir: str | None = None, log: Log) -> HostResult:
    started = time.monotonic()
    with opened(target, options, board_name, install_dir) as install:
        board, layout, state = install.board, install.layout, install.state
        result = HostResult(host=board.label, install_dir=layout.install_dir, action="rolled back")
        current = install.releases.current
        if current is None:
            raise BmoeError(f"{board.label}: nothing is deployed in {layout.install_dir}")
        previous = _previous(install)
        rel = layout.release(previous)
        raw, manifest = release_manifest(board, rel, "cannot roll back to it")
        say(log, board.label, f"verifying {previous} on the board")
        verify_release(board, rel, manifest, hashlib.sha256(raw).hexdigest())
        board.sh(SWITCH, layout.install_dir, previous, what="switching current")
        say(log, board.label, f"current -> releases/{previous} (was {current})")
        history = state.get("releases") if isinstance(state.get("releases"), dict) else {}
        entry = dict(history.get(previous) or {})
        entry["deployed_at"] = now()
        history[previous] = entry
        write_state(board, layout, {**state, "format": 1, "bundle_id": previous, "board": manifest.board,
                                    "deployed_at": entry["deployed_at"], "previous": current,
                                    "gates": entry.get("gates"), "install_dir": layout.install_dir,
                                    "releases": history, "rolled_back_from": current})
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
    with opened(target, options, board_name, install_dir) as install:
        releases, state = install.releases, install.state
        result = HostResult(host=install.board.label, install_dir=install.layout.install_dir, action="status")
        if releases.current is None:
            raise BmoeError(f"{install.board.label}: nothing is deployed in {install.layout.install_dir}"
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
        result.releases = releases.newest_first()
    result.ok = True
    result.seconds = time.monotonic() - started
    return result


def rollback(hosts: Sequence[Target], *, options: SshOptions, board_name: str | None = None,
             install_dir: str | None = None, log: Log | None = None) -> list[HostResult]:
    log = log or stderr_log()
    return run_fleet(hosts, lambda t: rollback_host(t, options=options, board_name=board_name,
                                                    install_dir=install_dir, log=log), what="rollback")


def status(hosts: Sequence[Target], *, options: SshOptions, board_name: str | None = None,
           install_dir: str | None = None) -> list[HostResult]:
    return run_fleet(hosts, lambda t: status_host(t, options=options, board_name=board_name,
                                                  install_dir=install_dir), what="status")
