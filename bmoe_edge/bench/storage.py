"""A board's storage on this machine's drive: `--storage CLASS|BOARD|MB/s[:IOPS]` resolved to a read
limit on the model's block device, and the cross-check that the drive then delivers it.

The classes are data: each is a `_storage-CLASS.yaml` profile fragment (board_profiles/, sources in
docs/boards.md) that boards pull in with `extends`; a board name means that board's `storage:`. The
throttle itself is `ramcap.throttle_reads` (the cgroup blkio controller, in the cell's own cgroup).
"""

from __future__ import annotations

import mmap
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bmoe_edge.bench.machine import drop_page_cache
from bmoe_edge.bench.ramcap import ReadLimit
from bmoe_edge.errors import BmoeError

NATIVE = "native"  # the drive as it is: no throttle
MB = 1_000_000     # storage speeds are decimal MB/s, as drives and the profiles state them


@dataclass(frozen=True)
class StorageTarget:
    """What a cell's reads are held to: a name for the records, MB/s and IOPS (0: no IOPS limit)."""

    name: str
    read_mb_s: float
    read_iops: int = 0
    latency_us: float | None = None
    board: str | None = None  # the board whose storage this is: `bench stream`'s `defaults` cell runs its profile

    @property
    def read_bps(self) -> int:
        return int(self.read_mb_s * MB)


def parse_storage(spec: str, named: Mapping[str, StorageTarget]) -> StorageTarget | None:
    """`native` (None: no throttle), `MB/s[:IOPS]` (`430`, `90:5000`), or a name in `named`: a storage
    class (`microsd`, `rpi5-nvme-gen2`: a `_storage-CLASS` fragment) or a board (`rpi5`: its
    `storage:`), which the caller reads from the profiles (cli: `storage_targets`)."""
    text = spec.strip()
    if text == NATIVE:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(?::(\d+))?", text)
    if m:
        mb_s, iops = float(m.group(1)), int(m.group(2) or 0)
        if mb_s <= 0:
            raise BmoeError(f"--storage {spec!r}: the bandwidth must be more than 0 MB/s")
        return StorageTarget(f"{mb_s:g}MB/s" + (f":{iops}" if iops else ""), mb_s, iops)
    if text in named:
        return named[text]
    raise BmoeError(f"--storage {spec!r} is not a storage class or board ({', '.join(sorted(named))}), "
                    f"MB/s[:IOPS] or {NATIVE}")


def _mount_of(dev: str) -> tuple[str, str]:
    """(fstype, mount point) of the filesystem whose device number is `dev` (MAJ:MIN)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            if parts[2] == dev:
                return parts[sep + 1], parts[4]
    return "?", "?"


def block_device(path: Path) -> str:
    """The whole disk (`MAJ:MIN`) that `path`'s reads go to: the file's filesystem device, or the disk of
    its partition. A clear error for a file with no block device under it (tmpfs, overlay, NFS, FUSE)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sys_dev = Path("/sys/dev/block") / dev
    if not sys_dev.exists():
        fstype, mount = _mount_of(dev)
        raise BmoeError(f"{path} is on {fstype} ({mount}), which has no block device to throttle: copy the "
                        "model to a disk-backed filesystem to run it at a storage class")
    real = sys_dev.resolve()
    if (real / "partition").exists():  # the controller throttles whole disks only
        return (real.parent / "dev").read_text().strip()
    return dev


def read_limit(target: StorageTarget, model: Path) -> ReadLimit:
    return ReadLimit(block_device(model), target.read_bps, target.read_iops)


# ---------------------------------------------------------------------------------------------------
# The cross-check: what the drive delivers to a throttled process (run inside the cell's cgroups).


def _parts(path: Path, lanes: int) -> list[tuple[int, int]]:
    """`lanes` contiguous, page-aligned parts of the file: (start, end)."""
    size = path.stat().st_size // 4096 * 4096
    step = max(4096, size // lanes // 4096 * 4096)
    return [(i * step, size if i == lanes - 1 else (i + 1) * step) for i in range(lanes)]


def _in_lanes(path: Path, lanes: int, seconds: float, read_part: Any) -> tuple[float, int]:
    """Run `read_part(fd_path, start, end, stop_time) -> bytes` in `lanes` threads, one part of the file
    each (one serial reader leaves the drive idle while it copies: the engine has lanes for that)."""
    import threading

    done = [0] * lanes
    stop = time.perf_counter() + seconds

    def lane(i: int, start: int, end: int) -> None:
        done[i] = read_part(path, start, end, stop)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=lane, args=(i, a, b)) for i, (a, b) in enumerate(_parts(path, lanes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(done)
    return total / MB / (time.perf_counter() - t0), total


def _odirect_part(path: Path, start: int, end: int, stop: float, chunk: int = 4 << 20) -> int:
    """Sequential O_DIRECT reads of `chunk` bytes over [start, end), wrapping."""
    chunk = min(chunk, end - start)
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    done, off = 0, start
    try:
        while time.perf_counter() < stop:
            if off + chunk > end:
                off = start
            done += os.preadv(fd, [buf], off)
            off += chunk
    finally:
        os.close(fd)
        buf.close()
    return done


def _buffered_part(path: Path, start: int, end: int, stop: float, chunk: int = 4 << 20) -> int:
    """Sequential buffered reads (the kernel's read-ahead on) over [start, end), the part's pages
    dropped at every wrap."""
    fd = os.open(path, os.O_RDONLY)
    done, off = 0, start
    try:
        while time.perf_counter() < stop:
            if off >= end:
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
                off = start
            n = len(os.pread(fd, min(chunk, end - off), off))
            done += n
            off += n
    finally:
        os.close(fd)
    return done


def _mmap_part(path: Path, start: int, end: int, stop: float, chunk: int = 1 << 20) -> int:
    """A read-only mapping copied out in order, 1 MiB at a time (page faults and their read-around, as
    llama.cpp's mmap baseline takes them; the copy is C, so a busy CPU does not bound it the way a
    Python loop over pages would); the part's pages dropped at every wrap."""
    done = 0
    with open(path, "rb") as f:
        while time.perf_counter() < stop:
            m = mmap.mmap(f.fileno(), end - start, prot=mmap.PROT_READ, offset=start)
            try:
                for off in range(0, end - start, chunk):
                    done += len(m[off:off + chunk])
                    if time.perf_counter() >= stop:
                        break
            finally:
                m.close()
            os.posix_fadvise(f.fileno(), start, end - start, os.POSIX_FADV_DONTNEED)
    return done


def _iops_4k(path: Path, seconds: float, lanes: int = 4) -> float:
    """Random 4 KiB O_DIRECT reads from `lanes` threads (a queue the IOPS limit can bind)."""
    import random
    import threading

    slots = max(1, path.stat().st_size // 4096)
    counts = [0] * lanes
    stop = time.perf_counter() + seconds

    def lane(i: int) -> None:
        rng = random.Random(i)
        buf = mmap.mmap(-1, 4096)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            while time.perf_counter() < stop:
                os.preadv(fd, [buf], rng.randrange(slots) * 4096)
                counts[i] += 1
        finally:
            os.close(fd)
            buf.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=lane, args=(i,)) for i in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def check_seconds(seconds: float, class_mb_s: float | None) -> float:
    """Each path's window: long enough that the read-ahead still in flight when it ends (up to 8 MiB
    per lane here) and the throttle's first slice are a few % of what was read (~800 MB), at most 10 s."""
    return max(seconds, min(10.0, 800 / class_mb_s)) if class_mb_s else seconds


def storage_check(path: Path, seconds: float = 3.0, lanes: int = 4) -> dict[str, Any]:
    """The cross-check cell's measurements: MB/s through O_DIRECT, buffered reads and an mmap (each in
    `lanes` threads over their own parts of the file), and 4 KiB IOPS. In a throttled cell they show
    what the throttle lets through; unthrottled, what the drive does."""
    drop_page_cache(path)
    od, od_bytes = _in_lanes(path, lanes, seconds, _odirect_part)
    drop_page_cache(path)
    buf, buf_bytes = _in_lanes(path, lanes, seconds, _buffered_part)
    drop_page_cache(path)
    mm, mm_bytes = _in_lanes(path, lanes, seconds, _mmap_part)
    iops = _iops_4k(path, min(seconds, 3.0))
    return {"odirect_mb_s": round(od, 1), "buffered_mb_s": round(buf, 1), "mmap_mb_s": round(mm, 1),
            "iops_4k": round(iops), "check_bytes": od_bytes + buf_bytes + mm_bytes, "check_lanes": lanes}


def check_verdict(record: dict[str, Any], target: StorageTarget | None) -> dict[str, Any]:
    """Each measured path against the class: the ratio and whether it is within 10%."""
    if target is None:
        return {}
    out: dict[str, Any] = {}
    for key in ("odirect_mb_s", "buffered_mb_s", "mmap_mb_s"):
        got = float(record.get(key, 0) or 0)
        ratio = got / target.read_mb_s
        out[key.replace("_mb_s", "_ratio")] = round(ratio, 3)
        out[key.replace("_mb_s", "_within_10pct")] = abs(ratio - 1) <= 0.10
    if target.read_iops:
        out["iops_ratio"] = round(float(record.get("iops_4k", 0) or 0) / target.read_iops, 3)
    return out
