"""What fleet commands report, below every step: the log lines, one host's result, and the reports
(the table, one host for humans, JSON)."""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bmoe_edge.units import size_text

Log = Callable[[str], None]


def say(log: Log, label: str, message: str) -> None:
    log(f"[{label}] {message}")


def stderr_log() -> Log:
    lock = threading.Lock()

    def log(message: str) -> None:
        with lock:
            print(message, file=sys.stderr, flush=True)

    return log


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
# Reports.


def gates_text(g: dict[str, Any] | None) -> str:
    if not g:
        return "-"
    return f"{g['passed']} passed, {g['failed']} failed" + (" (quick)" if g.get("quick") else "")


def strip_host(r: HostResult) -> str:
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
                detail = (f"{r.bundle_id}; deployed {r.deployed_at or '?'}; gates {gates_text(r.gates)}"
                          + (f"; {r.note}" if r.note else ""))
            elif r.action == "rolled back":
                detail = f"{r.previous} -> {r.bundle_id}"
            elif r.action == "pushed":
                detail = f"{', '.join(r.releases)}; sent {size_text(r.bytes_uploaded)}; {r.seconds:.0f} s"
            else:
                detail = (f"{r.bundle_id}; uploaded {r.files_uploaded} files ({size_text(r.bytes_uploaded)}); "
                          f"gates {gates_text(r.gates)}; {r.seconds:.0f} s")
            rows.append((r.host, r.board or "-", "ok", detail))
        else:
            rows.append((r.host, r.board or "-", "FAILED", strip_host(r)))
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
                 f"deployed:    {r.deployed_at or '?'}", f"gates:       {gates_text(r.gates)}"]
        if r.gates and r.gates.get("failing"):
            lines += [f"             {f}" for f in r.gates["failing"]]
        lines.append(f"previous:    {r.previous or '-'}")
        lines.append(f"releases:    {', '.join(r.releases) or '-'}")
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
            f"gates {gates_text(r.gates)}; previous {r.previous or '-'}{service}")


def report_json(results: Sequence[HostResult]) -> str:
    return json.dumps({"ok": all(r.ok for r in results), "hosts": [r.as_dict() for r in results]}, indent=2)


def describe_text(services: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """`status`: one line per installed service (services.describe finds their states)."""
    return [f"{name} {info.get('state')}, {info.get('bind')}:{info.get('port')}"
            + (f", model {info['model']}" if info.get("model") else "") for name, info in services.items()]
