"""Per-host results of fleet commands, running them over many hosts in parallel, and their reports
(the table, one host for humans, JSON)."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from bmoe_edge.errors import BmoeError
from bmoe_edge.fleet.remote import Target
from bmoe_edge.fleet.state import Log, mib

# ---------------------------------------------------------------------------------------------------
# Results.


@dataclass
class HostResult:
    host: str
    board: str | None = None
    ok: bool = False
    action: str = ""                  # deployed | redeployed | rolled back | status
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
    releases: list[str] = field(default_factory=list)
    note: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------
# Fleets: many hosts in parallel; one failing host never stops the others.


def run_fleet(targets: Sequence[Target], work: Callable[[Target], HostResult], *, jobs: int | None = None,
              what: str = "deploy") -> list[HostResult]:
    def one(target: Target) -> HostResult:
        started = time.monotonic()
        try:
            return work(target)
        except BmoeError as exc:
            return HostResult(host=target.label, board=target.board, error=str(exc),
                              seconds=time.monotonic() - started, action=what)
        except Exception as exc:   # a bug must not take the other hosts down; report it
            return HostResult(host=target.label, board=target.board, action=what,
                              error=f"{target.label}: unexpected {type(exc).__name__}: {exc}",
                              seconds=time.monotonic() - started)

    if len(targets) == 1:
        return [one(targets[0])]
    with ThreadPoolExecutor(max_workers=jobs or min(len(targets), 16)) as pool:
        return list(pool.map(one, targets))


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
            else:
                detail = (f"{r.bundle_id}; uploaded {r.files_uploaded} files ({mib(r.bytes_uploaded)}); "
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
        if r.note:
            lines.append(f"note:        {r.note}")
        return "\n".join(lines)
    if r.action == "rolled back":
        return f"{r.host}: rolled back to {r.bundle_id} (was {r.previous})"
    moved = (f"uploaded {r.files_uploaded} of {r.files} files ({mib(r.bytes_uploaded)}), "
             f"{r.files_copied} copied on the board, {r.files_present} already there")
    return (f"{r.host}: {r.action} {r.bundle_id} in {r.install_dir} ({r.seconds:.0f} s): {moved}; "
            f"gates {_gates_text(r.gates)}; previous {r.previous or '-'}")


def report_json(results: Sequence[HostResult]) -> str:
    return json.dumps({"ok": all(r.ok for r in results), "hosts": [r.as_dict() for r in results]}, indent=2)
