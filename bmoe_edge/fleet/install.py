"""Installing a release (its wheels unpacked by its own launcher), its gates, and the files a deploy
writes beside the releases (state.json, bin/bmoe-edge, the systemd unit); pruning old releases."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

from bmoe_edge import __version__
from bmoe_edge.boards import bundle
from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.commands import Board, env_argv, tail
from bmoe_edge.fleet.report import Log, say
from bmoe_edge.fleet.scripts import COMMIT, HANGUP, INSTALL, MARK_FAILED, REMOVE_IN
from bmoe_edge.fleet.state import (
    GATES_TIMEOUT,
    HEALTH_TIMEOUT,
    INSTALL_TIMEOUT,
    STAMP,
    UNIT_NAME,
    UNIT_TEMPLATE,
    VERSION_TIMEOUT,
    Layout,
    Releases,
    list_releases,
    now,
    release_env,
    write_pointer,
    write_state,
)
from bmoe_edge.fleet.systemd import render_job_unit
from bmoe_edge.fleet.upload import LocalBundle, verify_site


def check_runs(board: Board, launcher: str, m: bundle.Manifest, env: dict[str, str], what: str,
               timeout: float = VERSION_TIMEOUT) -> None:
    """`launcher --version` on the board reports the bundle's arch (and the hook, when it has one)."""
    check = board.sh(HANGUP, *env_argv(env, [launcher, "--version"]),
                     what=what, check=False, timeout=timeout, hangup=True)
    if check.exited != 0 or f"machine: {m.arch}" not in check.stdout:
        raise BmoeError(f"{board.label}: the installed release does not run on the board (exit {check.exited}): "
                        f"{tail(check.stderr or check.stdout)}")
    if m.extra.get("hook") and "hook: yes" not in check.stdout:
        raise BmoeError(f"{board.label}: the installed release says it has no expert-ready hook")


def install(board: Board, b: LocalBundle, layout: Layout, log: Log) -> None:
    """Unpack the wheels into the partial's site/ (under the board lock; stopped with the connection),
    check site/ is exactly what the wheels hold and that the release runs."""
    m = b.manifest
    partial = layout.partial(m.bundle_id)
    say(log, board.label, "installing (unpacking the wheels into site/ on the board)")
    board.sh(INSTALL, partial, what="installing the release (launcher --install-site)", timeout=INSTALL_TIMEOUT,
             hangup=True)
    verify_site(board, partial, b.site_sha256)
    check_runs(board, f"{partial}/{bundle.LAUNCHER_SCRIPT}", m, {"BMOE_EDGE_RELEASE": partial},
               "running the installed release (--version)")


def commit(board: Board, b: LocalBundle, layout: Layout, releases: Releases, gates: dict[str, Any] | None) -> None:
    """Stamp the checked partial complete (its site/ digest, its gate result) and rename it into place."""
    m = b.manifest
    partial = layout.partial(m.bundle_id)
    stamp = {"bundle_id": m.bundle_id, "board": m.board, "arch": m.arch, "installed_at": now(),
             "files": len(m.files), "bmoe_edge_version": m.bmoe_edge_version, "site_sha256": b.site_sha256,
             "gates": None if gates is None else {k: gates[k] for k in ("passed", "failed", "quick", "at")}}
    board.write_bytes(f"{partial}/{STAMP}", (json.dumps(stamp) + "\n").encode())
    board.sh(COMMIT, partial, layout.release(m.bundle_id),
             layout.release(releases.current) if releases.current else "",
             what="committing the release")


HEALTH_ATTEMPTS = 3      # a health check is tried this often before a release is marked failed for good
HEALTH_PAUSE = 5.0       # s between the attempts


def retried(check: Callable[[], None], attempts: int = HEALTH_ATTEMPTS, pause: float = HEALTH_PAUSE) -> None:
    """Run `check` until it passes, at most `attempts` times, `pause` s apart; the last failure is
    raised. A release is marked failed (never rolled back to) only when it fails every time, not after
    one transient failure (a board busy swapping, a slow first start)."""
    for attempt in range(1, attempts + 1):
        try:
            check()
            return
        except BmoeError:
            if attempt == attempts:
                raise
            time.sleep(pause)


def health_check(board: Board, layout: Layout, m: bundle.Manifest, timeout: float = HEALTH_TIMEOUT) -> None:
    """After a switch, within the deadline: the release `current` points at runs
    (`current/launcher/bmoe-edge.sh --version`, the link resolved by the launcher itself) and passes one
    gate cell on its own fixtures (streamed == resident)."""
    check_runs(board, f"{layout.current}/{bundle.LAUNCHER_SCRIPT}", m, {}, "health check of current (--version)",
               timeout=timeout)
    if not m.fixtures:
        return
    cur = layout.current
    fixtures = f"{cur}/{bundle.FIXTURES_DIR}"
    result = board.sh(HANGUP, *env_argv({"BMOE_EDGE_FIXTURES": fixtures},
                                        [f"{cur}/{bundle.LAUNCHER_SCRIPT}", "gates", "--quick", "--json",
                                         "--limit", "1", "--fixtures", fixtures]),
                      what="health check of current (one gate cell)", check=False, timeout=timeout, hangup=True)
    if "No such option: --limit" in result.stderr:
        return      # a release from before the smoke cell: --version is its health check
    try:
        report = json.loads(result.stdout)
    except ValueError:
        report = None
    if result.exited != 0 or not isinstance(report, dict) or report.get("failed") or not report.get("passed"):
        cell = next((c for c in (report or {}).get("cells", []) if not c.get("passed")), None)
        why = (cell or {}).get("error") or tail(result.stderr or result.stdout)
        raise BmoeError(f"{board.label}: health check of current: its gate cell failed (exit {result.exited}): "
                        f"{why}")


def mark_failed(board: Board, rel: str, why: str) -> None:
    board.sh(MARK_FAILED, rel, " ".join(why.split())[:500], what="marking the release failed")


def run_gates(board: Board, rel: str, *, full: bool = False, json_out: bool = True,
           out: Any = None) -> tuple[int, str, dict[str, Any] | None]:
    """Run the gates of a release on the board: (exit code, stdout, parsed JSON report or None)."""
    args = [f"{rel}/{bundle.LAUNCHER_SCRIPT}", "gates", *([] if full else ["--quick"]),
            "--fixtures", f"{rel}/{bundle.FIXTURES_DIR}", *(["--json"] if json_out else [])]
    env = release_env(rel)
    result = board.sh(HANGUP, *env_argv(env, args), what="running the gates",
                      check=False, timeout=GATES_TIMEOUT, out=out, err=sys.stderr if out is not None else None,
                      hangup=True)
    report = None
    if json_out:
        with contextlib.suppress(ValueError):
            report = json.loads(result.stdout)
    if result.exited != 0 and report is None:
        return result.exited, result.stdout, None
    return result.exited, result.stdout, report if isinstance(report, dict) else None


def gates_record(report: dict[str, Any], bundle_id: str, quick: bool) -> dict[str, Any]:
    failing = [f"{c.get('arch')} {c.get('quant')} split={c.get('split')} {c.get('config')}"
               + (f": {c['error']}" if c.get("error") else
                  f": first difference at step {c.get('first_difference')}")
               for c in report.get("cells", []) if not c.get("passed")]
    return {"bundle_id": bundle_id, "at": now(), "quick": quick, "passed": int(report.get("passed", 0)),
            "failed": int(report.get("failed", 0)), "failing": failing}


def write_board_files(board: Board, b: LocalBundle, layout: Layout, releases: Releases, previous: str | None,
                       gates: dict[str, Any] | None, state: dict[str, Any]) -> None:
    m = b.manifest
    at = now()
    history = state.get("releases") if isinstance(state.get("releases"), dict) else {}
    entry = dict(history.get(m.bundle_id) or {})
    entry["deployed_at"] = at
    entry.pop("failed", None)    # it passed its health check now
    if gates is not None:
        entry["gates"] = gates
    history[m.bundle_id] = entry
    keep_ids = set(releases.complete) | {m.bundle_id}
    new_state = {
        "format": 1, "bundle_id": m.bundle_id, "board": m.board, "deployed_at": at,
        "deployed_by": f"bmoe-edge {__version__}", "previous": previous,
        "gates": entry.get("gates"), "install_dir": layout.install_dir,
        "releases": {k: v for k, v in history.items() if k in keep_ids},
    }
    if isinstance(state.get("services"), dict):    # the services installed on the board (services.py)
        new_state["services"] = state["services"]
    write_state(board, layout, new_state)
    board.sh("mkdir -p -- \"$1/bin\" \"$1/systemd\"", layout.install_dir, what="creating bin/ and systemd/")
    board.write_bytes(f"{layout.install_dir}/bin/bmoe-edge", wrapper_script(layout.install_dir).encode(), 0o755)
    template = b.dir / UNIT_TEMPLATE
    if template.is_file():
        unit = render_job_unit(template.read_text(encoding="utf-8"), layout.install_dir, board.conn.user,
                           ram_mb=b.profile.ram_mb)
        board.write_bytes(f"{layout.install_dir}/systemd/{UNIT_NAME}", unit.encode())
    write_pointer(board, {"install_dir": layout.install_dir, "board": m.board, "bundle_id": m.bundle_id})


def record_failure(board: Board, layout: Layout, state: dict[str, Any], bundle_id: str, why: str) -> None:
    """state.json: the release failed its health check (the rest of the state unchanged)."""
    history = state.get("releases") if isinstance(state.get("releases"), dict) else {}
    entry = dict(history.get(bundle_id) or {})
    entry["failed"] = {"at": now(), "why": why}
    history[bundle_id] = entry
    state["releases"] = history
    write_state(board, layout, state)


def wrapper_script(install_dir: str) -> str:
    return (
        "#!/bin/sh\n"
        "# bmoe-edge on this board: runs the current release. Written by `bmoe-edge deploy`; put this\n"
        "# directory on PATH to type `bmoe-edge gates` or `bmoe-edge generate --board ...` here.\n"
        f"install_dir={shlex.quote(install_dir)}\n"
        'BMOE_EDGE_PROFILES="$install_dir/current/profile${BMOE_EDGE_PROFILES:+:$BMOE_EDGE_PROFILES}"\n'
        'BMOE_EDGE_FIXTURES=${BMOE_EDGE_FIXTURES:-$install_dir/current/fixtures}\n'
        "export BMOE_EDGE_PROFILES BMOE_EDGE_FIXTURES\n"
        'exec "$install_dir/current/launcher/bmoe-edge.sh" "$@"\n'
    )


def prune(board: Board, layout: Layout, keep: int, current: str, previous: str | None, log: Log) -> list[str]:
    rel = list_releases(board, layout, create=False)
    ordered = rel.newest_first()
    kept = set(ordered[:keep]) | {current} | ({previous} if previous else set())
    doomed = [r for r in ordered if r not in kept]
    stale = [o for o in rel.others if o.startswith(".") and o.endswith(".partial")
             and o != f".{current}.partial" and "/" not in o]
    if doomed or stale:
        board.sh(REMOVE_IN, layout.releases, *doomed, *stale, what="deleting old releases")
        if doomed:
            say(log, board.label, f"deleted {len(doomed)} old release(s) beyond --keep {keep}: {', '.join(doomed)}")
    return [r for r in ordered if r in kept]
