"""What the campaign scripts beside the records share, Python's half (campaign.sh is the shell's).

A run's Python script imports it from its folder, bench-data/DATE/RUN/:

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # bench-data/
    import campaign

- `join_cap(name, cap_mib=..., read_bps=..., device=...)`: this process into the cgroups a `bench stream`
  cell runs in (a memory cap, a read throttle), through bmoe_edge.bench.ramcap, the cells' own code.
- `run_line(label, fields, lines)`: one line from a `generate --json` output (campaign.sh's `run_line`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path


def join_cap(name: str, cap_mib: int | None = None, read_bps: int | None = None,
             device: str | None = None) -> tuple[Path | None, Path | None]:
    """Move this process into a memory cgroup (v1) limited to `cap_mib` MiB and/or a blkio cgroup (v1)
    whose reads from `device` (MAJ:MIN of a whole disk) are throttled to `read_bps` bytes/s, each a child
    named NAME-PID; what is None is left alone. Returns the two cgroups' paths (None where not made).
    Call it before the engine opens: the memory it takes is charged from then on."""
    from bmoe_edge.bench import ramcap

    memory = blkio = None
    if cap_mib:
        parent = ramcap.memory_cgroup_v1()
        if parent is None:
            sys.exit("no memory cgroup v1 here")
        cap = ramcap.CgroupV1Cap(cap_mib << 20, parent)
        cap.path = parent / f"{name}-{os.getpid()}"
        cap.prepare()
        cap.preexec()          # in this process: it joins the cgroup itself
        memory = cap.path
    if read_bps:
        blkio = ramcap.read_throttle_parent() / f"{name}-{os.getpid()}"
        blkio.mkdir()
        ramcap.throttle_reads(blkio, device or "254:0", read_bps)
        (blkio / "cgroup.procs").write_text(str(os.getpid()))
    return memory, blkio


def run_line(label: str, fields: Iterable[str], lines: Iterable[str]) -> str:
    """LABEL, then `field value` for each FIELD[:FORMAT] of the run record (first) or the summary of a
    `generate --json` output, then the load average."""
    rows = [json.loads(line) for line in lines if line.strip()]
    run = next(r for r in rows if r["type"] == "run")
    summary = next(r for r in rows if r["type"] == "summary")
    out = [label]
    for spec in fields:
        key, _, fmt = spec.partition(":")
        value = run[key] if key in run else summary.get(key)
        out += [key, format(value, fmt) if fmt else str(value)]
    return " ".join([*out, "load", Path("/proc/loadavg").read_text().split()[0]])


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "run-line":
        sys.exit("usage: campaign.py run-line LABEL FIELD[:FORMAT]... < generate --json output")
    print(run_line(sys.argv[2], sys.argv[3:], sys.stdin))
