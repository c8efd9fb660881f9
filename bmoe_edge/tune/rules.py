"""What `bmoe-edge tune` chooses from its measurements (measure.py):

- `read_path`: odirect, unless pread is clearly faster (its best bandwidth > 1.1x O_DIRECT's) or
  O_DIRECT is unavailable on that file system;
- `io_threads`: the fewest lanes whose bandwidth (the mean over the sizes) is within 5% of the best;
- `storage.read_mb_s`: that bandwidth, in MB/s;
- `threads`: the count with the best tok/s (the fewer on a tie);
- `cache_margin_mb`: what `auto` keeps free beyond what the engine counts itself (its working set and
  the experts in flight): 64 MiB + 1% of the effective memory limit (allocator churn, page tables, the
  kernel's slack), + with pread the page cache its reads pass through (2 x lanes x the largest slice),
  rounded up to 16 MiB;
- `page_size`: only when the kernel's differs from the profile's.

Pure functions of the measurements: a unit test drives them without a machine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bmoe_edge.errors import BmoeError
from bmoe_edge.tune.measure import ComputeCell, IoCell, Machine
from bmoe_edge.units import MiB

LANE_TOLERANCE = 0.95       # the fewest lanes within 5% of the best bandwidth
PREAD_ADVANTAGE = 1.10      # pread is chosen only when it is more than 10% faster than O_DIRECT
MARGIN_BASE_MB = 64
MARGIN_LIMIT_FRACTION = 0.01


@dataclass(frozen=True)
class Choice:
    read_path: str
    io_threads: int
    read_mb_s: int
    threads: int
    cache_margin_mb: int
    page_size: int | None           # only when the kernel's differs from the profile's
    why: dict[str, str] = field(default_factory=dict)


def lane_curve(cells: Sequence[IoCell], mode: str) -> dict[int, float]:
    """lanes -> the mean bandwidth over the sizes (MiB/s) of one read path."""
    by: dict[int, list[float]] = {}
    for c in cells:
        if c.mode == mode:
            by.setdefault(c.lanes, []).append(c.mib_s)
    return {n: statistics.fmean(v) for n, v in sorted(by.items())}


def cache_margin(read_path: str, lanes: int, sizes: Sequence[int], effective_mb: int) -> int:
    page_cache = 2 * lanes * max(sizes) / MiB if read_path == "pread" else 0.0
    mb = MARGIN_BASE_MB + MARGIN_LIMIT_FRACTION * effective_mb + page_cache
    return int(math.ceil(mb / 16) * 16)


def choose(io: Sequence[IoCell], odirect_note: str, compute: Sequence[ComputeCell], machine: Machine,
           sizes: Sequence[int], profile_page_size: int | None = None) -> Choice:
    curves = {m: lane_curve(io, m) for m in ("odirect", "pread")}
    curves = {m: c for m, c in curves.items() if c}
    if not curves:
        raise BmoeError("no read was measured")
    best = {m: max(c.values()) for m, c in curves.items()}
    why: dict[str, str] = {}
    if "odirect" not in curves:
        path = "pread"
        why["read_path"] = odirect_note or "O_DIRECT unavailable"
    elif "pread" in curves and best["pread"] > PREAD_ADVANTAGE * best["odirect"]:
        path = "pread"
        why["read_path"] = (f"pread {best['pread']:.0f} MiB/s > {PREAD_ADVANTAGE:.2f} x O_DIRECT "
                            f"{best['odirect']:.0f} MiB/s")
    else:
        path = "odirect"
        why["read_path"] = (f"O_DIRECT {best['odirect']:.0f} MiB/s vs pread {best.get('pread', 0):.0f} MiB/s "
                            "(pread must be >10% faster)")
    curve = curves[path]
    lanes = min(n for n, v in curve.items() if v >= LANE_TOLERANCE * best[path])
    why["io_threads"] = (f"fewest lanes within {100 - 100 * LANE_TOLERANCE:.0f}% of the best "
                         f"({best[path]:.0f} MiB/s at {max(curve, key=curve.__getitem__)})")
    read_mb_s = max(1, round(curve[lanes] * MiB / 1e6))
    why["read_mb_s"] = f"{path} at {lanes} lane(s), mean over {len(sizes)} size(s)"
    if compute:
        top = max(compute, key=lambda c: (c.tok_s, -c.threads))
        threads = top.threads
        why["threads"] = f"best decode tok/s ({top.tok_s:.1f})"
    else:
        threads = 1
        why["threads"] = "not measured"
    margin = cache_margin(path, lanes, sizes, machine.effective_mb)
    why["cache_margin_mb"] = (f"{MARGIN_BASE_MB} + {100 * MARGIN_LIMIT_FRACTION:.0f}% of {machine.effective_mb} MiB"
                              + (" + pread's page cache" if path == "pread" else ""))
    page = None
    if profile_page_size is not None and machine.page_size != profile_page_size \
            and machine.page_size in (4096, 16384, 65536):
        page = machine.page_size
        why["page_size"] = f"the kernel's is {machine.page_size}, the profile said {profile_page_size}"
    return Choice(path, lanes, read_mb_s, threads, margin, page, why)
