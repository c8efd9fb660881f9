"""`bmoe-edge rollback` and `status`: switch `current` back (after verifying it — its files, its site/
and, where the board trusts keys, its signature — under the board lock, health-checked after), or
report it (its site/ verified)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet import services
from bmoe_edge.fleet.commands import Board
from bmoe_edge.fleet.install import health_check, mark_failed, record_failure, retried
from bmoe_edge.fleet.lock import LOCK_TIMEOUT, board_lock
from bmoe_edge.fleet.parallel import run_fleet
from bmoe_edge.fleet.remote import SshOptions
from bmoe_edge.fleet.report import HostResult, Log, say, stderr_log
from bmoe_edge.fleet.scripts import SWITCH
from bmoe_edge.fleet.state import (
    Layout,
    Releases,
    connect,
    list_releases,
    now,
    opened,
    read_gates,
    read_state,
    release_manifest,
    write_pointer,
    write_state,
)
from bmoe_edge.fleet.targets import Target
from bmoe_edge.fleet.trust import check_rollback_target
from bmoe_edge.fleet.upload import verify_release, verify_site


def gates_failed(state: dict[str, Any]) -> set[str]:
    """Releases whose last recorded gate run on the board (`gates --host`, deploy --gates) failed a cell."""
    history = state.get("releases") if isinstance(state.get("releases"), dict) else {}
    return {rid for rid, entry in history.items()
            if isinstance(entry, dict) and isinstance(entry.get("gates"), dict) and entry["gates"].get("failed")}


def _previous(board: Board, layout: Layout, releases: Releases, state: dict[str, Any]) -> str:
    """The release to roll back to: the one state.json records, else the newest other complete one;
    never one marked failed, nor one whose recorded gate run failed (streamed != resident there)."""
    current = releases.current
    bad = releases.failed | gates_failed(state)
    previous = state.get("previous") if state.get("bundle_id") == current else None
    if (not isinstance(previous, str) or previous not in releases.complete or previous == current
            or previous in bad):
        older = [r for r in releases.good_newest_first() if r != current and r not in bad]
        previous = older[0] if older else None
    if previous is None:
        failed = sorted(bad - {current})
        raise BmoeError(f"{board.label}: no previous release in {layout.install_dir} to roll back to "
                        f"(current: {current}" + (f"; marked failed: {', '.join(failed)}" if failed
                                                  else "") + ")")
    return previous


def rollback_host(target: Target, *, options: SshOptions, board_name: str | None = None,
                  install_dir: str | None = None, log: Log, lock_timeout: float = LOCK_TIMEOUT) -> HostResult:
    started = time.monotonic()
    board, layout = connect(target, options, board_name, install_dir)
    with board, board_lock(board, layout.install_dir, action="rollback", wait=lock_timeout,
                           say=lambda text: say(log, board.label, text)):
        releases = list_releases(board, layout, create=False)     # read under the lock
        state = read_state(board, layout)
        result = HostResult(host=board.label, install_dir=layout.install_dir, action="rolled back")
        current = releases.current
        if current is None:
            raise BmoeError(f"{board.label}: nothing is deployed in {layout.install_dir}")
        previous = _previous(board, layout, releases, state)
        rel = layout.release(previous)
        raw, manifest = release_manifest(board, rel, "cannot roll back to it")
        say(log, board.label, f"verifying {previous} on the board")
        verify_release(board, rel, manifest, hashlib.sha256(raw).hexdigest())
        check_rollback_target(board, layout, previous)
        signed = manifest.extra.get("site_sha256")    # the build's, covered by the signature
        verify_site(board, rel, signed if isinstance(signed, str) else releases.complete[previous].get("site_sha256"))
        board.sh(SWITCH, layout.install_dir, previous, what="switching current")
        try:
            retried(lambda: health_check(board, layout, manifest))
        except BmoeError as exc:
            why = str(exc).removeprefix(f"{board.label}: ")
            mark_failed(board, rel, why)
            record_failure(board, layout, state, previous, why)
            board.sh(SWITCH, layout.install_dir, current, what="switching current back")
            raise BmoeError(f"{board.label}: health check of {previous} failed after the switch ({why}); "
                            f"current is {current} again, {previous} is marked failed") from None
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
        services.restart_services(board, layout, state, log)
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
        if stamp is not None:     # what runs from site/ (on PYTHONPATH) is still what was installed
            verify_site(install.board, install.layout.release(releases.current), stamp.get("site_sha256"))
        result.services = services.describe(install.board, state) or None
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
