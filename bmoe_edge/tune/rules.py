"""What `bmoe-edge tune` chooses from its measurements (measure.py):

- `read_path`: odirect, unless pread is clearly faster (its best bandwidth > 1.1x O_DIRECT's) or
  O_DIRECT is unavailable on that file system;
- `io_threads`: the fewest lanes whose bandwidth (the mean over the sizes) is within 5% of the best;
- `storage.read_mb_s`: that bandwidth, in MB/s;
- `threads`: from the streaming decode cells (compute threads beside the read lanes, the way runs use
  them): the count with the best median tok/s, unless the profile's own count (0 = auto, resolved by the
  engine's own rule: `_native.compute_threads`) is within the spread of the rounds of the best — a tie —
  and then it is left alone;
- `cache_margin_mb`: what `auto` keeps free beyond what the engine counts itself (its working set and
  the experts in flight): 64 MiB + 1% of the effective memory limit (allocator churn, page tables, the
  kernel's slack), + with pread the page cache its reads pass through (2 x lanes x the largest slice),
  rounded up to 16 MiB;
- `page_size`: only when the kernel's differs from the profile's.

A field is left alone (None, the profile's value stays) when its measurement would not carry over to
real models (`leave`: a toy model's tiny slices for the read fields, its tiny layers or small file for
`threads`) or nothing was measured; `Choice.left` says why.

Pure functions of the measurements: a unit test drives them without a machine.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bmoe_edge.engine import native
from bmoe_edge.engine.settings import BY_NAME
from bmoe_edge.errors import BmoeError
from bmoe_edge.tune.measure import ComputeCell, IoCell, Machine
from bmoe_edge.units import MiB

LANE_TOLERANCE = 0.95       # the fewest lanes within 5% of the best bandwidth
PREAD_ADVANTAGE = 1.10      # pread is chosen only when it is more than 10% faster than O_DIRECT
MARGIN_BASE_MB = 64
MARGIN_LIMIT_FRACTION = 0.01
READ_FIELDS = ("read_path", "io_threads", "read_mb_s")


@dataclass(frozen=True)
class Choice:
    read_path: str | None           # None: left alone (the profile's value stays), `left` says why
    io_threads: int | None
    read_mb_s: int | None
    threads: int | None
    cache_margin_mb: int
    page_size: int | None           # only when the kernel's differs from the profile's
    why: dict[str, str] = field(default_factory=dict)
    left: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Reads:
    read_path: str
    io_threads: int
    read_mb_s: int
    why: dict[str, str]


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


def choose_reads(io: Sequence[IoCell], odirect_note: str, sizes: Sequence[int]) -> Reads:
    """The read path, the lanes and their bandwidth (also what the streaming compute cells run with)."""
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
    return Reads(path, lanes, read_mb_s, why)


def streaming_threads(threads: int, cores: int) -> int:
    """What a thread setting is in a streaming run on `cores` cores: the engine's own rule (0 = auto)."""
    return int(native.load().compute_threads(threads, True, cores))


def choose_threads(compute: Sequence[ComputeCell], profile_threads: int, cores: int) -> tuple[int | None, str]:
    """The best streaming count, or None (left alone) when the profile's own count ties with it."""
    cells = [c for c in compute if c.mode == "stream"]
    if not cells:
        return None, "no streaming decode was measured"
    best = max(cells, key=lambda c: (c.tok_s, -c.threads))
    own = streaming_threads(profile_threads, cores)
    tied = sorted(c.threads for c in cells if c.high >= best.low)
    shown = f"{profile_threads} (auto: {own} streaming)" if profile_threads == 0 else str(profile_threads)
    if own == best.threads:
        return None, f"the profile's {shown} measured best ({best.tok_s:.2f} tok/s streaming)"
    if own in tied:
        return None, (f"the profile's {shown} is within the rounds' spread of the best "
                      f"({best.threads}: {best.low:.2f}-{best.high:.2f} tok/s streaming)")
    return best.threads, (f"best streaming decode ({best.tok_s:.2f} tok/s, {best.low:.2f}-{best.high:.2f}); "
                          f"the profile's {shown} is slower beyond the spread")


def choose(io: Sequence[IoCell], odirect_note: str, compute: Sequence[ComputeCell], machine: Machine,
           sizes: Sequence[int], profile_page_size: int | None = None, *,
           before: Mapping[str, Any] | None = None, leave: Mapping[str, str] | None = None) -> Choice:
    """`before`: the profile's values of what tune sets (profile_before; None = the engine's default);
    `leave`: 'reads' and/or 'compute' -> why those measurements do not carry over (they are not used)."""
    before = before or {}
    leave = leave or {}
    reads = choose_reads(io, odirect_note, sizes)
    why = dict(reads.why)
    left: dict[str, str] = {}
    path: str | None = reads.read_path
    lanes: int | None = reads.io_threads
    read_mb_s: int | None = reads.read_mb_s
    if "reads" in leave:
        path = lanes = read_mb_s = None
        for key in READ_FIELDS:
            left[key] = leave["reads"]
    if "compute" in leave:
        threads = None
        left["threads"] = leave["compute"]
    else:
        own = before.get("threads")
        threads, reason = choose_threads(compute, BY_NAME["threads"].default if own is None else own, machine.cores)
        (why if threads is not None else left)["threads"] = reason
    margin_path = path or before.get("read_path") or str(BY_NAME["read_path"].default)
    margin_lanes = lanes or before.get("io_threads") or BY_NAME["io_threads"].default
    margin = cache_margin(margin_path, margin_lanes, sizes, machine.effective_mb)
    why["cache_margin_mb"] = (f"{MARGIN_BASE_MB} + {100 * MARGIN_LIMIT_FRACTION:.0f}% of {machine.effective_mb} MiB"
                              + (" + pread's page cache" if margin_path == "pread" else ""))
    page = None
    if profile_page_size is not None and machine.page_size != profile_page_size \
            and machine.page_size in (4096, 16384, 65536):
        page = machine.page_size
        why["page_size"] = f"the kernel's is {machine.page_size}, the profile said {profile_page_size}"
    return Choice(path, lanes, read_mb_s, threads, margin, page, why, left)
