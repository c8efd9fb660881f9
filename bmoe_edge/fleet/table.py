"""Per-host results of fleet commands, running them over many hosts in parallel, and their reports
(the table, one host for humans, JSON)."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.remote import Target, Watch, watched
from bmoe_edge.fleet.state import Log
from bmoe_edge.units import size_text

HOST_TIMEOUT = 4 * 3600.0     # a host still at work after this is cut off (--host-timeout)

# ---------------------------------------------------------------------------------------------------
# Results.


@dataclass
class HostResult:
    host: str
    board: str | None = None
    ok: bool = False
    action: str = ""                  # deployed | redeployed | rolled back | status | pushed
    error: str | None = None
    install_dir: str | None = None
    bundle_id: str | None = None      # the current release afterwards
    previous: str | None = None
    files: int = 0
    files_present: int = 0            # already on the board with the right sha256
    files_copied: int = 0             # copied on the board from another release there
    files_uploaded: int = 0
    bytes_uploaded: int = 0
    gates: dict[str, Any] | None = None
    deployed_at: str | None = None
    releases: list[str] = field(default_factory=list)   # kept releases (push-model: the files in place)
    note: str | None = None
    services: dict[str, Any] | None = None   # status: each installed service and its state; deploy --service
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------
# Fleets: many hosts in parallel; one failing host never stops the others.


def run_fleet(targets: Sequence[Target], work: Callable[[Target], HostResult], *, max_parallel: int | None = None,
              fail_fast: bool = False, host_timeout: float | None = HOST_TIMEOUT,
              what: str = "deploy") -> list[HostResult]:
    """`work` for every target on a pool of `max_parallel` threads (default: all, up to 16).

    Every host is one row: a BmoeError (or a bug) is that host's failure, never the others'. A host
    still at work `host_timeout` seconds after it started has its SSH connections closed (whatever it
    waits on fails at once) and is reported as past its deadline. With `fail_fast` hosts not started
    when one fails are skipped."""
    stop = threading.Event()

    def one(target: Target, watch: Watch, started: list[float]) -> HostResult:
        started.append(time.monotonic())
        if stop.is_set():
            return HostResult(host=target.label, board=target.board, action=what,
                              error=f"{target.label}: skipped: another host failed first (--fail-fast)")
        try:
            with watched(watch):
                result = work(target)
        except BmoeError as exc:
            result = HostResult(host=target.label, board=target.board, error=str(exc), action=what)
        except Exception as exc:   # a bug must not take the other hosts down; report it
            result = HostResult(host=target.label, board=target.board, action=what,
                                error=f"{target.label}: unexpected {type(exc).__name__}: {exc}")
        if watch.expired and not result.ok:
            result.error = (f"{target.label}: no result within the host deadline of {host_timeout:.0f} s "
                            f"(--host-timeout); the connection was closed ({_strip_host(result)})")
        result.seconds = result.seconds or time.monotonic() - started[0]
        if not result.ok and fail_fast:
            stop.set()
        return result

    watches = [Watch() for _ in targets]
    starts: list[list[float]] = [[] for _ in targets]
    workers = max(1, min(len(targets), max_parallel or 16))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, t, w, st) for t, w, st in zip(targets, watches, starts, strict=True)]
        pending = set(futures)
        try:
            while pending:
                _done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                if host_timeout is None:
                    continue
                now = time.monotonic()
                for f, w, st in zip(futures, watches, starts, strict=True):
                    if f in pending and st and not w.expired and now - st[0] > host_timeout:
                        w.expire()
        except BaseException:     # Ctrl-C: every connection closed, so the workers end at once
            stop.set()
            for w in watches:
                w.expire()
            raise
        return [f.result() for f in futures]


def stderr_log() -> Log:
    lock = threading.Lock()

    def log(message: str) -> None:
        with lock:
            print(message, file=sys.stderr, flush=True)

    return log


# ---------------------------------------------------------------------------------------------------
# Reports.


def _gates_text(g: dict[str, Any] | None) -> str:
    if not g:
        return "-"
    return f"{g['passed']} passed, {g['failed']} failed" + (" (quick)" if g.get("quick") else "")


def _strip_host(r: HostResult) -> str:
    err = r.error or ""
    for prefix in (f"{r.host}: ",):
        if err.startswith(prefix):
            return err[len(prefix):]
    return re.sub(r"^\S+@\S+: ", "", err)


def format_table(results: Sequence[HostResult]) -> str:
    rows = [("HOST", "BOARD", "RESULT", "DETAIL")]
    for r in results:
        if r.ok:
            if r.action == "status":
                detail = (f"{r.bundle_id}; deployed {r.deployed_at or '?'}; gates {_gates_text(r.gates)}"
                          + (f"; {r.note}" if r.note else ""))
            elif r.action == "rolled back":
                detail = f"{r.previous} -> {r.bundle_id}"
            elif r.action == "pushed":
                detail = f"{', '.join(r.releases)}; sent {size_text(r.bytes_uploaded)}; {r.seconds:.0f} s"
            else:
                detail = (f"{r.bundle_id}; uploaded {r.files_uploaded} files ({size_text(r.bytes_uploaded)}); "
                          f"gates {_gates_text(r.gates)}; {r.seconds:.0f} s")
            rows.append((r.host, r.board or "-", "ok", detail))
        else:
            rows.append((r.host, r.board or "-", "FAILED", _strip_host(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3] for row in rows]
    failed = sum(not r.ok for r in results)
    lines.append(f"{len(results) - failed} of {len(results)} hosts ok" + (f", {failed} failed" if failed else ""))
    return "\n".join(lines)


def format_one(r: HostResult) -> str:
    """A successful single-host result, for humans."""
    if r.action == "status":
        lines = [f"host:        {r.host}", f"install dir: {r.install_dir}",
                 f"current:     releases/{r.bundle_id}", f"board:       {r.board}",
                 f"deployed:    {r.deployed_at or '?'}", f"gates:       {_gates_text(r.gates)}"]
        if r.gates and r.gates.get("failing"):
            lines += [f"             {f}" for f in r.gates["failing"]]
        lines.append(f"previous:    {r.previous or '-'}")
        lines.append(f"releases:    {', '.join(r.releases) or '-'}")
        from bmoe_edge.fleet.services import describe_text

        lines += [f"service:     {line}" for line in describe_text(r.services or {})]
        if r.note:
            lines.append(f"note:        {r.note}")
        return "\n".join(lines)
    if r.action == "rolled back":
        return f"{r.host}: rolled back to {r.bundle_id} (was {r.previous})"
    if r.action == "pushed":
        return (f"{r.host}: {', '.join(r.releases)} in place, sha256 verified; sent {r.files_uploaded} of "
                f"{r.files} files ({size_text(r.bytes_uploaded)}) in {r.seconds:.0f} s")
    moved = (f"uploaded {r.files_uploaded} of {r.files} files ({size_text(r.bytes_uploaded)}), "
             f"{r.files_copied} copied on the board, {r.files_present} already there")
    service = "".join(f"; service {name} active on {s.get('bind')}:{s.get('port')}"
                      for name, s in (r.services or {}).items())
    return (f"{r.host}: {r.action} {r.bundle_id} in {r.install_dir} ({r.seconds:.0f} s): {moved}; "
            f"gates {_gates_text(r.gates)}; previous {r.previous or '-'}{service}")


def report_json(results: Sequence[HostResult]) -> str:
    return json.dumps({"ok": all(r.ok for r in results), "hosts": [r.as_dict() for r in results]}, indent=2)
