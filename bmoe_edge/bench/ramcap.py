"""The RAM cap of a benchmark cell: a cgroup v1 child of our own memory cgroup, cgroup v2 `memory.max`,
or a balloon process that locks memory; and its read throttle (a storage class: `throttle_reads`, the
blkio controller). The one place in Python that reads and writes cgroups.

    python -m bmoe_edge.bench.ramcap balloon BYTES   # the balloon process (spawned by BalloonCap)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.bench.machine import mem_info
from bmoe_edge.errors import BmoeError
from bmoe_edge.units import MiB


@dataclass
class CapResult:
    method: str
    limit_bytes: int
    max_usage_bytes: int = 0
    failcnt: int = 0
    oom_kills: int = 0
    note: str = ""
    throttle: str = ""          # "254:0 430000000 B/s 50000 IOPS (blkio-v1)" when the cell's reads were throttled
    throttled_read_bytes: int = 0  # what the cell read from that device (the controller's own count)


def _cgroup_v1(controller: str, probe: str) -> Path | None:
    """Our own cgroup (v1) directory of `controller`, if the hierarchy is mounted (`probe` is a file
    only that controller's directories have)."""
    rel = None
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, cg = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                rel = cg
    if rel is None:
        return None
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            if parts[sep + 1] == "cgroup" and controller in parts[sep + 3].split(","):
                root, mount = parts[3], parts[4]
                sub = rel[len(root):] if root != "/" and rel.startswith(root) else rel
                path = Path(mount + "/" + sub.lstrip("/"))
                if (path / probe).exists():
                    return path
    return None


def memory_cgroup_v1() -> Path | None:
    """Our own memory cgroup (v1) directory, if the hierarchy is mounted."""
    return _cgroup_v1("memory", "memory.limit_in_bytes")


def blkio_cgroup_v1() -> Path | None:
    """Our own blkio cgroup (v1) directory, if the hierarchy is mounted with the throttle files."""
    return _cgroup_v1("blkio", "blkio.throttle.read_bps_device")


def cgroup_v2(controller: str = "memory") -> Path | None:
    """Our own cgroup v2 directory, if its children get `controller` (memory, io)."""
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                path = Path("/sys/fs/cgroup" + line.rstrip("\n")[3:])
                controllers = path / "cgroup.subtree_control"
                if controllers.exists() and controller in controllers.read_text().split():
                    return path
    return None


class MemCap:
    """A memory limit for one cell process: `prepare()` before spawning, `preexec` in the child,
    `finish()` after it exits (reads the peak and OOM counters, removes the cgroup)."""

    method = "none"

    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes

    def prepare(self) -> None: ...

    def preexec(self) -> None: ...

    def finish(self) -> CapResult:
        return CapResult(self.method, self.limit)


class NoCap(MemCap):
    def __init__(self) -> None:
        super().__init__(0)


class CgroupV1Cap(MemCap):
    method = "cgroup-v1"

    def __init__(self, limit_bytes: int, parent: Path) -> None:
        super().__init__(limit_bytes)
        self.parent = parent
        self.path = parent / f"bmoe-bench-{os.getpid()}-{time.monotonic_ns()}"

    def prepare(self) -> None:
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
        with contextlib.suppress(OSError):  # no swap here, but do not let the cell swap elsewhere
            (self.path / "memory.swappiness").write_text("0")

    def preexec(self) -> None:
        with open(self.path / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def finish(self) -> CapResult:
        def read(name: str) -> str:
            with contextlib.suppress(OSError):
                return (self.path / name).read_text()
            return ""

        result = CapResult(self.method, self.limit, int(read("memory.max_usage_in_bytes") or 0),
                           int(read("memory.failcnt") or 0))
        for line in read("memory.oom_control").splitlines():
            if line.startswith("oom_kill "):
                result.oom_kills = int(line.split()[1])
        for _ in range(50):  # the child's pages are reparented when it is removed
            try:
                self.path.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        else:
            result.note = f"could not remove {self.path}"
        return result


class CgroupV2Cap(MemCap):
    method = "cgroup-v2"

    def __init__(self, limit_bytes: int, parent: Path) -> None:
        super().__init__(limit_bytes)
        self.path = parent / f"bmoe-bench-{os.getpid()}-{time.monotonic_ns()}"

    def prepare(self) -> None:
        self.path.mkdir()
        (self.path / "memory.max").write_text(str(self.limit))
        with contextlib.suppress(OSError):
            (self.path / "memory.swap.max").write_text("0")

    def preexec(self) -> None:
        with open(self.path / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def finish(self) -> CapResult:
        result = CapResult(self.method, self.limit)
        with contextlib.suppress(OSError, ValueError):
            result.max_usage_bytes = int((self.path / "memory.peak").read_text())
        with contextlib.suppress(OSError):
            for line in (self.path / "memory.events").read_text().splitlines():
                if line.startswith("oom_kill "):
                    result.oom_kills = int(line.split()[1])
        with contextlib.suppress(OSError):
            self.path.rmdir()
        return result


class BalloonCap(MemCap):
    """Fallback: a process that allocates and locks (mlock; without swap, touched anonymous memory
    cannot be reclaimed anyway) MemAvailable - limit, so only `limit` is left for the cell. It caps
    the whole machine, not just the cell: use it on a dedicated board, not on a shared host."""

    method = "balloon"

    def __init__(self, limit_bytes: int, python: tuple[str, ...] = ()) -> None:
        super().__init__(limit_bytes)
        self.python = python

    def prepare(self) -> None:
        available = mem_info().get("MemAvailable", 0)
        self.size = available - self.limit
        if self.size <= 0:
            self.proc = None
            return
        self.proc = subprocess.Popen([*(self.python or [sys.executable]), "-m", "bmoe_edge.bench.ramcap", "balloon",
                                      str(self.size)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("ready"):
            raise BmoeError(f"the memory balloon did not start ({line.strip()!r})")
        self.locked = "locked" in line

    def finish(self) -> CapResult:
        note = ""
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            note = f"balloon {self.size // MiB} MiB ({'mlocked' if self.locked else 'touched, not locked'})"
        return CapResult(self.method, self.limit, note=note)


def balloon_main(size: int) -> None:
    """Hold `size` bytes of touched (and, if permitted, locked) anonymous memory until stdin closes."""
    import ctypes

    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    page = mmap.PAGESIZE
    for off in range(0, size, page):
        buf[off] = 1
    libc = ctypes.CDLL(None, use_errno=True)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    locked = libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size)) == 0
    print("ready locked" if locked else "ready touched", flush=True)
    sys.stdin.read()


# ---------------------------------------------------------------------------------------------------
# The read throttle: a board's storage class on this machine's drive (bmoe_edge.bench.storage).


@dataclass(frozen=True)
class ReadLimit:
    """Reads from one block device (`MAJ:MIN` of a whole disk) at most `read_bps` bytes/s and
    `read_iops` requests/s (0: no limit of that kind)."""

    device: str
    read_bps: int
    read_iops: int = 0


def throttle_reads(cgroup: Path, device: str, read_bps: int, read_iops: int = 0) -> str:
    """Throttle the reads that the processes in `cgroup` issue to the block device `device` (`MAJ:MIN`
    of a whole disk: the controller refuses a partition) to `read_bps` bytes/s and `read_iops`
    requests/s (0: no limit of that kind). `cgroup` is a cgroup v1 blkio directory
    (`blkio.throttle.read_{bps,iops}_device`) or a cgroup v2 directory whose parent enables `io`
    (`io.max`). O_DIRECT reads, buffered reads (page-cache misses and their read-ahead) and mmap faults
    are throttled alike: each is a bio the reading task submits. Returns the method (blkio-v1, io-v2)."""
    if (cgroup / "blkio.throttle.read_bps_device").exists():
        method = "blkio-v1"
        writes = [("blkio.throttle.read_bps_device", f"{device} {read_bps}"),
                  ("blkio.throttle.read_iops_device", f"{device} {read_iops}")]
    elif (cgroup / "io.max").exists():
        method = "io-v2"
        writes = [("io.max", f"{device} rbps={read_bps or 'max'} riops={read_iops or 'max'}")]
    else:
        raise BmoeError(f"{cgroup} has no blkio (v1) or io (v2) controller: reads cannot be throttled there")
    for name, text in writes:
        try:
            (cgroup / name).write_text(text)
        except OSError as exc:
            raise BmoeError(f"cannot throttle reads of block device {device} in {cgroup} ({name}: "
                            f"{exc.strerror or exc})") from None
    return method


def device_read_bytes(cgroup: Path, device: str) -> int:
    """Bytes the processes in `cgroup` read from `device`, as the controller counted them (0 if unknown)."""
    with contextlib.suppress(OSError, ValueError):
        v1 = cgroup / "blkio.throttle.io_service_bytes"
        if v1.exists():
            for line in v1.read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == device and parts[1] == "Read":
                    return int(parts[2])
            return 0
        for line in (cgroup / "io.stat").read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == device:
                return int(dict(p.split("=", 1) for p in parts[1:]).get("rbytes", 0))
    return 0


def read_throttle_parent() -> Path:
    """Where a cell's throttled cgroup is made: our blkio v1 cgroup, else our v2 cgroup with `io`;
    a clear error where neither is usable (no controller, or not writable)."""
    for parent in (blkio_cgroup_v1(), cgroup_v2("io")):
        if parent is not None and os.access(parent, os.W_OK):
            return parent
    raise BmoeError("no writable blkio cgroup (v1 blkio or v2 io controller) for this process: "
                    "--storage cannot throttle the model's reads here")


class ThrottledCap(MemCap):
    """A cell's memory cap (any MemCap) and its read throttle: under cgroup v1 a blkio child of ours
    beside the memory child, holding the same process; under v2 the memory child's own `io.max`."""

    def __init__(self, inner: MemCap, read_limit: ReadLimit) -> None:
        super().__init__(inner.limit)
        self.inner = inner
        self.method = inner.method
        self.read_limit = read_limit
        self.parent = read_throttle_parent()
        self.own = not isinstance(inner, CgroupV2Cap)
        self.path = self.parent / f"bmoe-bench-io-{os.getpid()}-{time.monotonic_ns()}"

    def prepare(self) -> None:
        self.inner.prepare()
        if not self.own:
            assert isinstance(self.inner, CgroupV2Cap)
            self.path = self.inner.path
        else:
            self.path.mkdir()
        lim = self.read_limit
        self.throttle_method = throttle_reads(self.path, lim.device, lim.read_bps, lim.read_iops)

    def preexec(self) -> None:
        self.inner.preexec()
        if self.own:
            with open(self.path / "cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def finish(self) -> CapResult:
        read = device_read_bytes(self.path, self.read_limit.device)
        result = self.inner.finish()
        if self.own:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
        lim = self.read_limit
        result.throttle = (f"{lim.device} {lim.read_bps} B/s {lim.read_iops or 'unlimited'} IOPS "
                           f"({self.throttle_method})")
        result.throttled_read_bytes = read
        return result


def make_cap(limit_bytes: int, method: str = "auto", read_limit: ReadLimit | None = None,
             python: Sequence[str] = ()) -> MemCap:
    """`auto`: a cgroup v1 child, else cgroup v2, else refuse (the balloon caps the whole machine and
    must be asked for explicitly). With `read_limit`, the cell's reads are throttled as well. `python`: how the
    balloon's Python starts, as a campaign's cells do (an emulated board's exec wrapper; () = sys.executable)."""
    cap = _memory_cap(limit_bytes, method, python)
    return ThrottledCap(cap, read_limit) if read_limit is not None else cap


def _memory_cap(limit_bytes: int, method: str, python: Sequence[str] = ()) -> MemCap:
    if limit_bytes <= 0:
        return NoCap()
    if method in ("auto", "cgroup-v1"):
        parent = memory_cgroup_v1()
        if parent is not None and os.access(parent, os.W_OK):
            return CgroupV1Cap(limit_bytes, parent)
        if method == "cgroup-v1":
            raise BmoeError("no writable cgroup v1 memory hierarchy for this process")
    if method in ("auto", "cgroup-v2"):
        parent2 = cgroup_v2()
        if parent2 is not None and os.access(parent2, os.W_OK):
            return CgroupV2Cap(limit_bytes, parent2)
        if method == "cgroup-v2":
            raise BmoeError("no writable cgroup v2 with the memory controller for this process")
    if method == "balloon":
        return BalloonCap(limit_bytes, python=tuple(python))
    raise BmoeError("no memory cgroup is usable here: pass --cap-method balloon to lock memory instead "
                    "(it limits the whole machine)")


def parse_cap(value: str, model_bytes: int) -> int:
    """`40%` of the model file, MiB (`1200`, `1200MB`, `1.5GB`), or `none` (0: no cap, no cgroup needed)."""
    v = value.strip().upper()
    if v == "NONE":
        return 0
    try:
        if v.endswith("%"):
            return int(model_bytes * float(v[:-1]) / 100)
        if v.endswith("GB") or v.endswith("G"):
            return int(float(v.rstrip("GB")) * 1024 * MiB)
        return int(float(v.rstrip("MB")) * MiB)
    except ValueError:
        raise BmoeError(f"--ram-cap must be PCT% of the model, MiB or none, got {value!r}") from None


if __name__ == "__main__":  # python -m bmoe_edge.bench.ramcap balloon BYTES
    if len(sys.argv) == 3 and sys.argv[1] == "balloon":
        balloon_main(int(sys.argv[2]))
    else:
        sys.exit("usage: python -m bmoe_edge.bench.ramcap balloon BYTES")
