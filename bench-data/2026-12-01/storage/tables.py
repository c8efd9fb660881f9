"""The tables of docs/benchmarks.md's "At a board's storage" section, from the campaign's cells.csv files:
per cell the median tok/s (min-max over repeats), MB fetched per token, hit %, the engine's compute and
stall ms per token, the I/O-bound tok/s at the class (class MB/s / MB fetched per token), the
compute-bound tok/s (1000 / the cell's own compute ms per token: no resident cell fits the 17 GB model
here), which is lower, and measured / the lower one.
    .venv/bin/python bench-data/2026-12-01/storage/tables.py DIR ..."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from bmoe_edge.bench.machine import read_csv
from bmoe_edge.bench.summary import aggregate, med_spread, missed_bytes_per_token


def table(out: Path) -> str:
    meta = json.loads((out / "run.json").read_text())
    st = meta.get("storage")
    mb_s = st["read_mb_s"] if st else None
    aggs = aggregate(read_csv(out / "cells.csv"))
    speed = f"{mb_s:g} MB/s" if mb_s else "unthrottled"
    lines = [f"`{out.name}` — {speed}, cap {meta['cap_bytes'] / 2**20:.0f} MiB, "
             f"{meta['repeats']} repeats", "",
             "| cell | tok/s median (min-max) | MB fetched/token | hit % | compute ms | stall ms | I/O-bound tok/s "
             "| compute-bound tok/s | bound | measured / min(bounds) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for a in sorted(aggs.values(), key=lambda a: -a.tok_s_med):
        if a.kind not in ("stream", "mmap", "resident") or not a.tok_s:
            continue
        ok = [r for r in a.rows if r.get("status") == "ok"]
        missed = statistics.median(missed_bytes_per_token(r) for r in ok)
        bound = mb_s * 1e6 / missed if mb_s and missed > 1e5 else 0.0
        compute = a.med("compute_ms_per_token")
        cbound = 1000 / compute if compute and a.kind == "stream" else 0.0  # the engine's own compute time
        limit = min(b for b in (bound, cbound) if b) if (bound or cbound) else 0.0
        which = ("I/O" if bound and (not cbound or bound <= cbound) else "compute") if limit else "-"
        lines.append(f"| {a.label} | {med_spread(a.tok_s, '{:.3g}')} | {missed / 1e6:.1f} | "
                     f"{a.med('cache_hit_pct'):.1f} | "
                     f"{compute:.0f} | {a.med('stall_ms_per_token'):.0f} | {f'{bound:.3g}' if bound else '-'} | "
                     f"{f'{cbound:.3g}' if cbound else '-'} | {which} | "
                     f"{f'{a.tok_s_med / limit:.2f}' if limit else '-'} |")
    check = [r for r in aggs["storage-check"].rows if r.get("status") == "ok"] if "storage-check" in aggs else []
    if check:
        def vals(k: str) -> str:
            return med_spread([float(r[k]) for r in check], "{:.0f}")
        lines += ["", f"storage check: O_DIRECT {vals('odirect_mb_s')}, buffered {vals('buffered_mb_s')}, mmap "
                      f"{vals('mmap_mb_s')} MB/s; 4 KiB IOPS {vals('iops_4k')}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for d in sys.argv[1:]:
        print(table(Path(d)))
