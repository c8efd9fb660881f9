"""Benchmarks: the drive's raw read bandwidth, streamed vs llama.cpp mmap under a RAM cap, routing.

Two halves:

- the measuring side (standard library and the engine only — it runs on a board without numpy):
  the gguf layout of the expert tensors, page-cache dropping, `io_sweep` (random reads of a size
  with N lanes, O_DIRECT or pread, cold), `io_replay` (the engine's read pattern without compute:
  per token and layer, the routed experts' gate/up/down slices with the engine's O_DIRECT windows
  and a barrier per layer), the RAM cap (a cgroup v1 child of our own memory cgroup, cgroup v2
  `memory.max`, or a balloon process that locks memory), and `run_cell` — one configuration in a
  fresh process that prints one JSON record;
- the host side (matplotlib for plots): `stream_campaign` runs the cells interleaved and repeated,
  and writes raw CSVs (per cell and per token), a markdown summary with the targets of issue 7
  (P1-P4) and the overlap ratio of issue 4, and PNG plots.

Every figure carries its context: thread counts, load average before and after, the cap method.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import math
import mmap
import os
import platform
import queue
import random
import re
import resource
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bmoe_edge.errors import BmoeError

PROMPT = "Once upon a time"
RECORD_PREFIX = "BMOE-BENCH-RECORD "
MiB = 1 << 20

# ---------------------------------------------------------------------------------------------
# gguf layout (standard library only)

# ggml type id -> (block elements, block bytes)
GGML_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
    11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2), 39: (32, 17),
}
_EXPERT_RE = re.compile(r"blk\.(\d+)\.(ffn_gate_up_exps|ffn_gate_exps|ffn_up_exps|ffn_down_exps)\.weight$")
_PROJ_ORDER = {"ffn_gate_exps": 0, "ffn_gate_up_exps": 0, "ffn_up_exps": 1, "ffn_down_exps": 2}


@dataclass(frozen=True)
class ExpertTensor:
    name: str
    layer: int
    projection: int
    offset: int  # absolute file offset of expert 0
    expert_bytes: int
    n_expert: int


@dataclass
class GgufLayout:
    path: Path
    file_bytes: int
    metadata: dict[str, Any]
    experts: list[ExpertTensor]

    @property
    def n_expert(self) -> int:
        return self.experts[0].n_expert if self.experts else 0

    @property
    def n_expert_used(self) -> int:
        arch = self.metadata.get("general.architecture", "")
        return int(self.metadata.get(f"{arch}.expert_used_count", 0))

    def layers(self) -> dict[int, list[ExpertTensor]]:
        out: dict[int, list[ExpertTensor]] = {}
        for t in self.experts:
            out.setdefault(t.layer, []).append(t)
        return {k: sorted(v, key=lambda t: t.projection) for k, v in sorted(out.items())}

    def bytes_per_expert(self, layer: int) -> int:
        return sum(t.expert_bytes for t in self.layers()[layer])

    @property
    def expert_bytes_total(self) -> int:
        return sum(t.expert_bytes * t.n_expert for t in self.experts)

    @property
    def routed_bytes_per_token(self) -> int:
        return sum(t.expert_bytes for t in self.experts) * self.n_expert_used

    def locate(self, offset: int) -> tuple[ExpertTensor, int] | None:
        for t in self.experts:
            if t.offset <= offset < t.offset + t.expert_bytes * t.n_expert:
                return t, (offset - t.offset) // t.expert_bytes
        return None


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _read_value(f: Any, vtype: int) -> Any:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]
    if vtype == 8:
        (n,) = struct.unpack("<Q", f.read(8))
        return f.read(n).decode("utf-8", "replace")
    if vtype == 9:
        sub, n = struct.unpack("<IQ", f.read(12))
        if sub in _SCALARS:
            size = struct.calcsize(_SCALARS[sub])
            f.seek(size * n, os.SEEK_CUR)  # arrays (vocabularies) are skipped
            return None
        for _ in range(n):
            _read_value(f, sub)
        return None
    raise BmoeError(f"unknown gguf value type {vtype}")


def gguf_layout(path: Path) -> GgufLayout:
    """Metadata scalars and the expert tensors' file offsets of a single-file gguf."""
    path = Path(path)
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise BmoeError(f"{path}: not a gguf file")
        _version, n_tensors, n_kv = struct.unpack("<IQQ", f.read(20))
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            (n,) = struct.unpack("<Q", f.read(8))
            key = f.read(n).decode()
            (vtype,) = struct.unpack("<I", f.read(4))
            meta[key] = _read_value(f, vtype)
        if int(meta.get("split.count", 1) or 1) > 1:
            raise BmoeError(f"{path}: split models are not supported by the benchmark (merge the shards)")
        infos = []
        for _ in range(n_tensors):
            (n,) = struct.unpack("<Q", f.read(8))
            name = f.read(n).decode()
            (n_dims,) = struct.unpack("<I", f.read(4))
            dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
            ttype, offset = struct.unpack("<IQ", f.read(12))
            infos.append((name, dims, ttype, offset))
        align = int(meta.get("general.alignment", 32) or 32)
        data_start = (f.tell() + align - 1) // align * align
    experts = []
    for name, dims, ttype, offset in infos:
        m = _EXPERT_RE.match(name)
        if not m or len(dims) != 3:
            continue
        if ttype not in GGML_TYPES:
            raise BmoeError(f"{path}: tensor {name} has ggml type {ttype}, unknown to the benchmark")
        block, size = GGML_TYPES[ttype]
        experts.append(ExpertTensor(name, int(m.group(1)), _PROJ_ORDER[m.group(2)], data_start + offset,
                                    dims[0] * dims[1] // block * size, int(dims[2])))
    return GgufLayout(path, path.stat().st_size, meta, experts)


# ---------------------------------------------------------------------------------------------
# Process and machine facts


def drop_page_cache(path: Path) -> None:
    """Write back and drop the file's pages from the page cache (what a cold read starts from)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def proc_read_bytes() -> int:
    """Bytes this process made the storage layer fetch (/proc/self/io read_bytes)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def mem_info() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            out[key] = int(rest.split()[0]) * 1024
    return out


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def machine_info(path: Path | None = None) -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.lower().startswith(("model name", "hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "hostname": platform.node(), "machine": platform.machine(), "kernel": platform.release(), "cpu": cpu,
        "cores": os.cpu_count(), "mem_total_mb": mem_info().get("MemTotal", 0) // MiB,
        "swap_total_mb": mem_info().get("SwapTotal", 0) // MiB, "loadavg": os.getloadavg(),
        "python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if path is not None:
        st = os.stat(path)
        dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        info["device"] = dev
        for key in ("logical_block_size", "read_ahead_kb", "rotational", "scheduler"):
            with contextlib.suppress(OSError), open(f"/sys/dev/block/{dev}/queue/{key}") as f:
                info[f"queue_{key}"] = f.read().strip()
    with contextlib.suppress(Exception):
        from bmoe_edge import native

        b = native.load().build_info()
        info["llama_pin"] = b.llama_pin
        info["hook"] = b.expert_ready_hook
    return info


# ---------------------------------------------------------------------------------------------
# Reading: lanes, aligned windows, O_DIRECT or pread


def _align_down(v: int, a: int) -> int:
    return v - v % a


def _align_up(v: int, a: int) -> int:
    return _align_down(v + a - 1, a)


def dio_alignment(path: Path) -> int:
    """The O_DIRECT alignment the engine would use (its statx/blockdev fallback): logical block size."""
    st = os.stat(path)
    with contextlib.suppress(OSError, ValueError), \
            open(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/queue/logical_block_size") as f:
        return int(f.read())
    # A partition: its parent's queue.
    with contextlib.suppress(OSError, ValueError):
        base = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve()
        return int((base.parent / "queue" / "logical_block_size").read_text())
    return 4096


class Lanes:
    """N reader threads, each with its own descriptor and a page-aligned buffer, one job queue.

    A read of (offset, length) with O_DIRECT covers the engine's window: [align_down(offset),
    min(align_up(offset + length), align_down(file size))) into a buffer address with the same
    phase modulo the page as the offset (as the engine's mirror has), plus a buffered tail at EOF.
    """

    def __init__(self, path: Path, lanes: int, mode: str, max_length: int) -> None:
        if mode not in ("odirect", "pread"):
            raise BmoeError(f"read mode must be odirect or pread, got {mode!r}")
        self.path, self.mode = Path(path), mode
        self.size = self.path.stat().st_size
        self.align = dio_alignment(path) if mode == "odirect" else 1
        flags = os.O_RDONLY | (os.O_DIRECT if mode == "odirect" else 0)
        self._fds = [os.open(path, flags) for _ in range(lanes)]
        self._tail_fds = [os.open(path, os.O_RDONLY) for _ in range(lanes)]
        page = mmap.PAGESIZE
        self._bufs = [mmap.mmap(-1, _align_up(max_length + 2 * max(self.align, page), page) + page)
                      for _ in range(lanes)]
        self._jobs: queue.SimpleQueue[tuple[int, int, Any] | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(lanes)]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join()
        for fd in (*self._fds, *self._tail_fds):
            os.close(fd)
        for b in self._bufs:
            b.close()

    def __enter__(self) -> Lanes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_full(self, fd: int, view: memoryview, offset: int) -> int:
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], offset + done)
            if n == 0:
                break
            done += n
        return done

    def read(self, lane: int, offset: int, length: int) -> int:
        """One slice read on `lane`; returns the bytes read from the file (windows included)."""
        buf = memoryview(self._bufs[lane])
        if self.mode == "pread":
            return self._read_full(self._fds[lane], buf[:length], offset)
        start = _align_down(offset, self.align)
        end = min(_align_up(offset + length, self.align), _align_down(self.size, self.align))
        phase = start % mmap.PAGESIZE
        got = self._read_full(self._fds[lane], buf[phase:phase + end - start], start) if end > start else 0
        if start + got < offset + length:  # the unaligned tail at EOF, buffered (as the engine does)
            tail = start + got
            n = offset + length - tail
            got += self._read_full(self._tail_fds[lane], buf[phase + got:phase + got + n], tail)
        return got

    def _run(self, lane: int) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            offset, length, batch = job
            t0 = time.perf_counter()
            try:
                n = self.read(lane, offset, length)
            except BaseException as exc:  # reported to the waiter
                batch.done(0, 0.0, exc)
                continue
            batch.done(n, time.perf_counter() - t0, None)

    def run(self, jobs: Sequence[tuple[int, int]]) -> _Batch:
        """Read every (offset, length) and wait for all of them."""
        batch = _Batch(len(jobs))
        for off, length in jobs:
            self._jobs.put((off, length, batch))
        batch.wait()
        return batch


class _Batch:
    def __init__(self, n: int) -> None:
        self.remaining = n
        self.bytes = 0
        self.latencies: list[float] = []
        self.error: BaseException | None = None
        self._cv = threading.Condition()

    def done(self, n: int, seconds: float, error: BaseException | None) -> None:
        with self._cv:
            self.bytes += n
            self.latencies.append(seconds)
            self.error = self.error or error
            self.remaining -= 1
            if self.remaining == 0:
                self._cv.notify_all()

    def wait(self) -> None:
        with self._cv:
            while self.remaining:
                self._cv.wait()
        if self.error is not None:
            raise BmoeError(f"read failed: {self.error}")


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def io_sweep(path: Path, *, sizes: Sequence[int], lanes: Sequence[int], modes: Sequence[str] = ("odirect", "pread"),
             seconds: float = 3.0, max_bytes: int = 2 << 30, seed: int = 0, repeats: int = 1,
             progress: Any = None) -> list[dict[str, Any]]:
    """Random reads of each size with each lane count and mode, cold (O_DIRECT, or dropped pages).

    Offsets are distinct size-aligned slots of the file in random order (no page is read twice in a
    cell, so pread never hits the page cache); each cell stops after `seconds`, `max_bytes`, or when
    the slots run out. Cells are interleaved across repeats.
    """
    size_file = Path(path).stat().st_size
    rows = []
    combos = [(m, s, n) for m in modes for s in sizes for n in lanes]
    for rep in range(repeats):
        order = combos[:]
        random.Random(seed * 1000 + rep).shuffle(order)
        for mode, size, n_lanes in order:
            rng = random.Random(f"{seed}-{rep}-{mode}-{size}-{n_lanes}")
            slot = _align_up(size, 4096)
            slots = list(range(0, size_file - slot, slot))
            rng.shuffle(slots)
            limit = min(len(slots), max(n_lanes, max_bytes // size))
            drop_page_cache(path)
            with Lanes(path, n_lanes, mode, size) as lanes_:
                io0 = proc_read_bytes()
                t0 = time.perf_counter()
                done = 0
                nbytes = 0
                lat: list[float] = []
                step = max(n_lanes * 4, 16)
                while done < limit and time.perf_counter() - t0 < seconds:
                    batch = lanes_.run([(slots[i], size) for i in range(done, min(limit, done + step))])
                    done += len(batch.latencies)
                    nbytes += batch.bytes
                    lat.extend(batch.latencies)
                elapsed = time.perf_counter() - t0
                storage = proc_read_bytes() - io0
            row = {
                "mode": mode, "size": size, "lanes": n_lanes, "repeat": rep, "reads": len(lat), "bytes": nbytes,
                "seconds": round(elapsed, 4), "mib_s": round(nbytes / MiB / elapsed, 2) if elapsed else 0.0,
                "storage_bytes": storage, "lat_p50_ms": round(1000 * _pct(lat, 0.5), 3),
                "lat_p99_ms": round(1000 * _pct(lat, 0.99), 3), "loadavg": loadavg(),
            }
            rows.append(row)
            if progress:
                progress(row)
    return rows


def io_replay(path: Path, *, tokens: int, lanes: int, mode: str = "odirect", seed: int = 0,
              barrier: bool = True, trace: list[list[list[int]]] | None = None) -> list[dict[str, Any]]:
    """The engine's cache-off read pattern without compute: per token, per layer, the routed
    experts' slices projection-major (uniform random experts, or a measured routing trace), with
    a barrier per layer (`barrier`, as the engine has) or the whole token at once. One row per token.
    """
    layout = gguf_layout(path)
    layers = layout.layers()
    k = layout.n_expert_used or 1
    rng = random.Random(seed)
    max_len = max(t.expert_bytes for t in layout.experts)
    rows = []
    if mode == "pread":
        drop_page_cache(path)
    with Lanes(path, lanes, mode, max_len) as lanes_:
        for step in range(tokens):
            token_jobs = []
            io0 = proc_read_bytes()
            t0 = time.perf_counter()
            nbytes = 0
            for il, tensors in layers.items():
                if trace is not None:
                    experts = sorted(set(trace[step % len(trace)][il]))
                else:
                    experts = sorted(rng.sample(range(tensors[0].n_expert), k))
                jobs = [(t.offset + e * t.expert_bytes, t.expert_bytes) for t in tensors for e in experts]
                if barrier:
                    nbytes += lanes_.run(jobs).bytes
                else:
                    token_jobs.extend(jobs)
            if token_jobs:
                nbytes += lanes_.run(token_jobs).bytes
            ms = 1000 * (time.perf_counter() - t0)
            rows.append({"step": step, "wall_ms": round(ms, 3), "bytes_read": nbytes,
                         "storage_bytes": proc_read_bytes() - io0})
    return rows


# ---------------------------------------------------------------------------------------------
# The RAM cap


@dataclass
class CapResult:
    method: str
    limit_bytes: int
    max_usage_bytes: int = 0
    failcnt: int = 0
    oom_kills: int = 0
    note: str = ""


def _memory_cgroup_v1() -> Path | None:
    """Our own memory cgroup (v1) directory, if the hierarchy is mounted and writable."""
    rel = None
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, cg = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                rel = cg
    if rel is None:
        return None
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            sep = parts.index("-")
            if parts[sep + 1] == "cgroup" and "memory" in parts[sep + 3].split(","):
                root, mount = parts[3], parts[4]
                sub = rel[len(root):] if root != "/" and rel.startswith(root) else rel
                path = Path(mount + "/" + sub.lstrip("/"))
                if (path / "memory.limit_in_bytes").exists():
                    return path
    return None


def _cgroup_v2() -> Path | None:
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                path = Path("/sys/fs/cgroup" + line.rstrip("\n")[3:])
                controllers = path / "cgroup.subtree_control"
                if controllers.exists() and "memory" in controllers.read_text().split():
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

    def prepare(self) -> None:
        available = mem_info().get("MemAvailable", 0)
        self.size = available - self.limit
        if self.size <= 0:
            self.proc = None
            return
        self.proc = subprocess.Popen([sys.executable, "-m", "bmoe_edge.bench", "balloon", str(self.size)],
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


def make_cap(limit_bytes: int, method: str = "auto") -> MemCap:
    """`auto`: a cgroup v1 child, else cgroup v2, else refuse (the balloon caps the whole machine and
    must be asked for explicitly)."""
    if limit_bytes <= 0:
        return NoCap()
    if method in ("auto", "cgroup-v1"):
        parent = _memory_cgroup_v1()
        if parent is not None and os.access(parent, os.W_OK):
            return CgroupV1Cap(limit_bytes, parent)
        if method == "cgroup-v1":
            raise BmoeError("no writable cgroup v1 memory hierarchy for this process")
    if method in ("auto", "cgroup-v2"):
        parent2 = _cgroup_v2()
        if parent2 is not None and os.access(parent2, os.W_OK):
            return CgroupV2Cap(limit_bytes, parent2)
        if method == "cgroup-v2":
            raise BmoeError("no writable cgroup v2 with the memory controller for this process")
    if method == "balloon":
        return BalloonCap(limit_bytes)
    raise BmoeError("no memory cgroup is usable here: pass --cap-method balloon to lock memory instead "
                    "(it limits the whole machine)")


def parse_cap(value: str, model_bytes: int) -> int:
    """`40%` of the model file, or MiB (`1200`, `1200MB`, `1.5GB`)."""
    v = value.strip().upper()
    try:
        if v.endswith("%"):
            return int(model_bytes * float(v[:-1]) / 100)
        if v.endswith("GB") or v.endswith("G"):
            return int(float(v.rstrip("GB")) * 1024 * MiB)
        return int(float(v.rstrip("MB")) * MiB)
    except ValueError:
        raise BmoeError(f"--ram-cap must be PCT% of the model or MiB, got {value!r}") from None


# ---------------------------------------------------------------------------------------------
# Cells: one configuration in a fresh process


@dataclass
class Cell:
    label: str
    kind: str  # resident | mmap | stream | io
    config: dict[str, Any] = field(default_factory=dict)  # StreamConfig fields (engine cells)
    capped: bool = True
    tokens: int = 64
    warmup: int = 0  # tokens generated (same prompt) before the measured run, same engine
    io: dict[str, Any] = field(default_factory=dict)  # io cells: mode, lanes, barrier
    group: str = ""  # for plots: resident | mmap | stream | io

    def spec(self, model: Path, tokens_csv: Path | None) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind, "model": str(model), "config": self.config,
                "tokens": self.tokens, "warmup": self.warmup, "io": self.io, "prompt": PROMPT,
                "tokens_csv": str(tokens_csv) if tokens_csv else ""}


TOKEN_COLUMNS = ("step", "n_tokens", "wall_ms", "io_ms", "stall_ms", "drain_ms", "compute_ms", "bytes_read",
                 "slice_bytes", "copy_bytes", "cache_lookups", "cache_hits", "evictions", "major_faults",
                 "rss_bytes", "resident_expert_bytes", "storage_bytes")


def _engine_cell(spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from bmoe_edge.engine import Engine, Generation, StreamConfig

    config = StreamConfig(**spec["config"])
    t0 = time.perf_counter()
    io_load0 = proc_read_bytes()
    with Engine(spec["model"], config) as engine:
        info = engine.run_info
        load_s = time.perf_counter() - t0
        load_storage = proc_read_bytes() - io_load0
        if spec["warmup"]:
            engine.run(spec["prompt"], spec["warmup"])
        rows: list[dict[str, Any]] = []
        gen = Generation([])
        prev = proc_read_bytes()
        for token in engine.generate(spec["prompt"], spec["tokens"], result=gen):
            now = proc_read_bytes()
            rows.append(asdict(token.metrics) | {"storage_bytes": now - prev})
            prev = now
        threads = proc_threads()
    record = {
        "stop_reason": gen.stop_reason, "generated": len(gen.tokens), "distinct_tokens": len(set(gen.tokens)),
        "process_threads": threads, "load_s": round(load_s, 3), "load_storage_bytes": load_storage,
        "run": {k: v for k, v in info.items() if k != "model"},
    }
    return record, rows


def _io_cell(spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    io = spec["io"]
    rows = io_replay(Path(spec["model"]), tokens=spec["tokens"] + 1, lanes=int(io.get("lanes", 4)),
                     mode=io.get("mode", "odirect"), seed=int(io.get("seed", 0)), barrier=bool(io.get("barrier", True)))
    for r in rows:
        r.update({"io_ms": r["wall_ms"], "compute_ms": 0.0, "rss_bytes": 0})
    return {"process_threads": proc_threads(), "run": {"io_threads": io.get("lanes", 4),
                                                       "read_path": io.get("mode", "odirect")}}, rows


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one cell in this process; returns its record (per-token rows go to tokens_csv)."""
    la0 = loadavg()
    t0 = time.perf_counter()
    record: dict[str, Any] = {"label": spec["label"], "kind": spec["kind"], "loadavg_before": la0}
    if spec["kind"] == "io":
        extra, rows = _io_cell(spec)
    else:
        extra, rows = _engine_cell(spec)
    record.update(extra)
    record.update(summarise_tokens(rows))
    record["peak_rss_bytes"] = max([r.get("rss_bytes", 0) for r in rows] +
                                   [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024])
    record["loadavg_after"] = loadavg()
    record["cell_s"] = round(time.perf_counter() - t0, 2)
    if spec.get("tokens_csv"):
        with open(spec["tokens_csv"], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=TOKEN_COLUMNS, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({c: r.get(c, 0) for c in TOKEN_COLUMNS})
    return record


def summarise_tokens(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Decode figures: the prompt step (step 0) is left out."""
    decode = [r for r in rows if r.get("step", 0) > 0]
    n = len(decode)
    if not n:
        return {"decode_tokens": 0}

    def total(key: str) -> float:
        return float(sum(r.get(key, 0) for r in decode))

    wall = total("wall_ms")
    lookups = total("cache_lookups")
    bytes_read = total("bytes_read")
    io_ms = total("io_ms")
    return {
        "decode_tokens": n,
        "tok_s": round(1000 * n / wall, 4) if wall else 0.0,
        "ms_per_token": round(wall / n, 3),
        "ms_per_token_median": round(statistics.median(r["wall_ms"] for r in decode), 3),
        "bytes_read_per_token": round(bytes_read / n),
        "storage_bytes_per_token": round(total("storage_bytes") / n),
        "copy_bytes_per_token": round(total("copy_bytes") / n),
        "cache_hit_pct": round(100 * total("cache_hits") / lookups, 2) if lookups else 0.0,
        "io_ms_per_token": round(io_ms / n, 3),
        "stall_ms_per_token": round(total("stall_ms") / n, 3),
        "drain_ms_per_token": round(total("drain_ms") / n, 3),
        "compute_ms_per_token": round(total("compute_ms") / n, 3),
        "read_mib_s": round(bytes_read / MiB / (io_ms / 1000), 1) if io_ms > 0 else 0.0,
        "major_faults_per_token": round(total("major_faults") / n, 2),
        "evictions_per_token": round(total("evictions") / n, 2),
    }


def cell_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    try:
        record = run_cell(spec)
        record["status"] = "ok"
    except BmoeError as exc:
        record = {"label": spec.get("label", ""), "kind": spec.get("kind", ""), "status": "error", "error": str(exc)}
    print(RECORD_PREFIX + json.dumps(record), flush=True)
    return 0 if record["status"] == "ok" else 1


def spawn_cell(cell: Cell, model: Path, cap: MemCap, tokens_csv: Path | None, timeout: float,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a cell in a fresh process (inside the cap), cold: the model's pages dropped first."""
    drop_page_cache(model)
    cap.prepare()
    cmd = [sys.executable, "-m", "bmoe_edge", "bench", "cell", json.dumps(cell.spec(model, tokens_csv))]
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=cap.preexec, start_new_session=True, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
            status = None
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            status = "timeout"
    finally:
        capped = cap.finish()
    record: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith(RECORD_PREFIX):
            record = json.loads(line[len(RECORD_PREFIX):])
    if not record:
        record = {"label": cell.label, "kind": cell.kind, "status": status or "crashed",
                  "error": f"exit {proc.returncode}: " + " | ".join(err.strip().splitlines()[-3:])}
        if capped.oom_kills or proc.returncode == -signal.SIGKILL:
            record["status"] = status or ("oom-killed" if capped.oom_kills else "killed")
    record.update({
        "wall_s": round(time.perf_counter() - t0, 2), "cap_method": capped.method,
        "cap_mb": round(capped.limit_bytes / MiB, 1), "cap_max_usage_mb": round(capped.max_usage_bytes / MiB, 1),
        "cap_failcnt": capped.failcnt, "cap_oom_kills": capped.oom_kills, "cap_note": capped.note,
    })
    return record


# ---------------------------------------------------------------------------------------------
# Routing: what the engine actually reads (strace of a serial, 1-lane, cache-off run)


def trace_routing(model: Path, tokens: int, workdir: Path, prompt: str = PROMPT) -> list[list[list[int]]]:
    """Per decoded token, per layer, the experts the engine read: strace of its pread64 calls in a
    serial, one-lane, cache-off run (every routed expert is read, in layer order). Needs strace."""
    layout = gguf_layout(model)
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "strace.log"
    spec = Cell("routing-trace", "stream", {"cache_mb": 0, "io_threads": 1, "overlap": False, "threads": 1,
                                            "ctx": _ctx_for(tokens)}, tokens=tokens).spec(model, None)
    cmd = ["strace", "-f", "-qq", "-s", "0", "-e", "trace=pread64", "-o", str(log), sys.executable, "-m", "bmoe_edge",
           "bench", "cell", json.dumps(spec)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600)
    except FileNotFoundError:
        raise BmoeError("bench routing needs strace (apt-get install strace)") from None
    except subprocess.CalledProcessError as exc:
        raise BmoeError(f"the traced run failed: {exc.stderr.strip()[-400:]}") from None
    pat = re.compile(r"pread64\(\d+, [^,]*, (\d+), (\d+)\) = (\d+)")
    steps: list[dict[int, set[int]]] = []
    last_layer = None
    with open(log) as f:
        for line in f:
            m = pat.search(line)
            if not m:
                continue
            length, offset = int(m.group(1)), int(m.group(2))
            hit = layout.locate(offset + length // 2)
            if hit is None or length < hit[0].expert_bytes // 2:
                continue
            tensor, expert = hit
            if last_layer is None or tensor.layer < last_layer:
                steps.append({})
            last_layer = tensor.layer
            steps[-1].setdefault(tensor.layer, set()).add(expert)
    log.unlink()
    n_layer = len(layout.layers())
    return [[sorted(s.get(il, ())) for il in range(n_layer)] for s in steps[1:]]  # drop the prompt step


def lru_hit_rate(trace: list[list[list[int]]], bytes_per_expert: Sequence[int], budget_bytes: int) -> float:
    """The engine's cache policy replayed on a routing trace: LRU over (layer, expert), the layer in
    flight never evicted; returns hits / lookups."""
    from collections import OrderedDict

    lru: OrderedDict[tuple[int, int], int] = OrderedDict()
    used = hits = lookups = 0
    for token in trace:
        for il, experts in enumerate(token):
            for e in experts:
                lookups += 1
                key = (il, e)
                if key in lru:
                    hits += 1
                    lru.move_to_end(key)
                else:
                    lru[key] = bytes_per_expert[il]
                    used += bytes_per_expert[il]
            if used > budget_bytes:
                for key in list(lru):
                    if used <= budget_bytes:
                        break
                    if key[0] == il:
                        continue
                    used -= lru.pop(key)
    return hits / lookups if lookups else 0.0


def routing_stats(trace: list[list[list[int]]], n_expert: int, k: int) -> dict[str, Any]:
    """Popularity (per-layer Zipf fit of the selection frequency), previous-token reuse."""
    n_layer = len(trace[0]) if trace else 0
    reuse = []
    for a, b in itertools.pairwise(trace):
        for il in range(n_layer):
            if a[il] and b[il]:
                reuse.append(len(set(a[il]) & set(b[il])) / len(b[il]))
    zipf, top_share = [], []
    freq_rank = [0.0] * n_expert
    for il in range(n_layer):
        counts = [0] * n_expert
        for tok in trace:
            for e in tok[il]:
                counts[e] += 1
        freq = sorted((c / len(trace) for c in counts), reverse=True)
        for r, f in enumerate(freq):
            freq_rank[r] += f / n_layer
        zipf.append(_zipf_slope(freq))
        top_share.append(sum(freq[: max(1, n_expert // 8)]) / max(1e-9, sum(freq)))
    return {
        "tokens": len(trace), "layers": n_layer,
        "prev_token_reuse": round(statistics.mean(reuse), 4) if reuse else 0.0, "chance_reuse": round(k / n_expert, 4),
        "zipf_per_layer_median": round(statistics.median(zipf), 3) if zipf else 0,
        "zipf_of_mean_ranked_freq": round(_zipf_slope(freq_rank), 3),
        "top_eighth_share_median": round(statistics.median(top_share), 4) if top_share else 0,
        "mean_ranked_freq": [round(f, 4) for f in freq_rank],
        "experts_touched_per_layer": round(statistics.mean(
            len({e for tok in trace for e in tok[il]}) for il in range(n_layer)), 2) if n_layer else 0,
    }


def _zipf_slope(freq: Sequence[float]) -> float:
    """-slope of log(frequency) on log(rank), leaving out saturated (always chosen) and unseen ranks."""
    pts = [(math.log(r + 1), math.log(f)) for r, f in enumerate(sorted(freq, reverse=True)) if 0 < f < 0.99]
    if len(pts) < 3:
        return 0.0
    mx = statistics.mean(p[0] for p in pts)
    my = statistics.mean(p[1] for p in pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return round(-sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx, 4) if sxx else 0.0


def routing_report(model: Path, tokens: int, out: Path, budgets_mb: Sequence[float] = ()) -> dict[str, Any]:
    layout = gguf_layout(model)
    trace = trace_routing(model, tokens, out)
    stats = routing_stats(trace, layout.n_expert, layout.n_expert_used)
    per_layer = [layout.bytes_per_expert(il) for il in sorted(layout.layers())]
    budgets = list(budgets_mb) or [0, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048,
                                   math.ceil(layout.expert_bytes_total / MiB)]
    stats["lru_hit_rate"] = {str(b): round(100 * lru_hit_rate(trace, per_layer, int(b * MiB)), 2) for b in budgets}
    stats["model_metadata"] = {k: v for k, v in layout.metadata.items() if k.startswith("bmoe.")}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "routing.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["token", "layer", "experts"])
        for t, tok in enumerate(trace):
            for il, experts in enumerate(tok):
                w.writerow([t, il, " ".join(map(str, experts))])
    (out / "routing.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def load_trace(path: Path) -> list[list[list[int]]]:
    tokens: dict[int, dict[int, list[int]]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            tokens.setdefault(int(row["token"]), {})[int(row["layer"])] = [int(e) for e in row["experts"].split()]
    return [[tok[il] for il in sorted(tok)] for _, tok in sorted(tokens.items())]


# ---------------------------------------------------------------------------------------------
# The campaign (host side)


def _ctx_for(tokens: int) -> int:
    return max(256, _align_up(tokens + 64, 256))


def default_cells(layout: GgufLayout, cap_bytes: int, *, tokens: int, mmap_tokens: int, threads: int,
                  budgets_mb: Sequence[float] | None = None) -> list[Cell]:
    """The standard matrix: resident warm; mmap under the cap; streamed under the same cap (cache off,
    fixed budgets, auto; 1 vs 4 lanes; pread vs O_DIRECT; overlap on/off); full-cache streamed (P1);
    the engine's read pattern without compute (io-only)."""
    expert_mb = layout.expert_bytes_total / MiB
    ctx = _ctx_for(max(tokens, mmap_tokens))
    base = {"threads": threads, "ctx": ctx, "batch": 64, "ubatch": 64}
    dense_mb = (layout.file_bytes - layout.expert_bytes_total) / MiB
    if budgets_mb is None:
        # What the cap leaves for the cache: the cap minus the dense weights (mapped, charged to the
        # cell), one layer in flight and ~240 MiB for the process (interpreter, libraries, KV, compute).
        room = cap_bytes / MiB - dense_mb - 240 if cap_bytes else expert_mb
        budgets_mb = sorted({max(0.0, round(x)) for x in (room / 4, room / 2, room)} - {0.0})
    cells = [
        Cell("resident", "resident", {**base, "stream": False}, capped=False, tokens=tokens, warmup=tokens,
             group="resident"),
        Cell("mmap", "mmap", {**base, "stream": False}, tokens=mmap_tokens, group="mmap"),
    ]

    def stream(label: str, **kw: Any) -> Cell:
        capped = kw.pop("capped", True)
        warm = kw.pop("warmup", 0)
        return Cell(label, "stream", {**base, "stream": True, "io_threads": 4, "read_path": "odirect",
                                      "overlap": False, "cache_mb": 0, **kw},
                    capped=capped, tokens=tokens, warmup=warm, group="stream")

    cells += [
        stream("off-serial-od4"),
        stream("off-overlap-od4", overlap=True),
        stream("off-serial-od1", io_threads=1),
        stream("off-overlap-od1", io_threads=1, overlap=True),
        stream("off-serial-pr4", read_path="pread"),
    ]
    for mb in budgets_mb:
        cells.append(stream(f"cache{mb:g}-overlap-od4", cache_mb=mb, overlap=True))
    cells.append(stream(f"cache{max(budgets_mb):g}-serial-od4", cache_mb=max(budgets_mb)))
    cells.append(stream("auto-overlap-od4", cache_mb="auto", overlap=True))
    if cap_bytes:
        cells.append(stream("auto-ceil-overlap-od4", cache_mb="auto", cache_ceil_mb=int(max(budgets_mb)),
                            overlap=True))
    full = math.ceil(expert_mb * 1.02 + 1)
    cells += [
        stream("fullcache-serial", cache_mb=full, capped=False, warmup=tokens),
        stream("fullcache-overlap", cache_mb=full, overlap=True, capped=False, warmup=tokens),
    ]
    io_tokens = min(tokens, 32)  # steady state is reached at once: no cache, no compute
    cells += [
        Cell("io-od4", "io", io={"mode": "odirect", "lanes": 4, "barrier": True}, tokens=io_tokens, group="io"),
        Cell("io-od1", "io", io={"mode": "odirect", "lanes": 1, "barrier": True}, tokens=io_tokens, group="io"),
        Cell("io-od4-nobarrier", "io", io={"mode": "odirect", "lanes": 4, "barrier": False}, tokens=io_tokens,
             group="io"),
        Cell("io-pr4", "io", io={"mode": "pread", "lanes": 4, "barrier": True}, tokens=io_tokens, group="io"),
    ]
    return cells


CELL_COLUMNS = (
    "model", "label", "kind", "repeat", "status", "tok_s", "ms_per_token", "ms_per_token_median", "decode_tokens",
    "bytes_read_per_token", "storage_bytes_per_token", "copy_bytes_per_token", "cache_hit_pct", "io_ms_per_token",
    "stall_ms_per_token", "drain_ms_per_token", "compute_ms_per_token", "read_mib_s", "major_faults_per_token",
    "evictions_per_token", "peak_rss_bytes", "cap_method", "cap_mb", "cap_max_usage_mb", "cap_failcnt",
    "cap_oom_kills", "threads", "io_threads", "read_path", "overlap", "cache_mode", "cache_budget_mb",
    "process_threads", "loadavg_before", "loadavg_after", "load_s", "load_storage_bytes", "distinct_tokens",
    "stop_reason", "cell_s", "wall_s", "warning", "error",
)


def _flatten(record: dict[str, Any], model: str, repeat: int) -> dict[str, Any]:
    run = record.get("run", {})
    out = {"model": model, "repeat": repeat, **{k: v for k, v in record.items() if k != "run"}}
    for key in ("threads", "io_threads", "read_path", "overlap", "cache_mode", "cache_budget_mb", "warning"):
        if key in run:
            out[key] = run[key]
    return out


@dataclass
class Campaign:
    model: Path
    out: Path
    cap_bytes: int
    cap_method: str
    cells: list[Cell]
    repeats: int
    io_sizes: Sequence[int] = ()
    io_seconds: float = 2.0
    routing_tokens: int = 0
    seed: int = 0
    log: Any = None


def stream_campaign(c: Campaign) -> dict[str, Any]:
    """Run every cell `repeats` times, interleaved (a shuffled order per repeat), each in a fresh
    process under the cap; with an io sweep at the start of each repeat. Writes the raw data."""
    c.out.mkdir(parents=True, exist_ok=True)
    raw = c.out / "tokens"
    raw.mkdir(exist_ok=True)
    layout = gguf_layout(c.model)
    say = c.log or (lambda s: print(s, file=sys.stderr, flush=True))
    meta = {
        "model": str(c.model), "file_bytes": layout.file_bytes, "expert_bytes": layout.expert_bytes_total,
        "routed_bytes_per_token": layout.routed_bytes_per_token, "n_expert": layout.n_expert,
        "n_expert_used": layout.n_expert_used, "n_layer": len(layout.layers()),
        "slice_bytes": sorted({t.expert_bytes for t in layout.experts}),
        "model_metadata": {k: v for k, v in layout.metadata.items() if k.startswith(("bmoe.", "general.name"))},
        "cap_bytes": c.cap_bytes, "cap_request_method": c.cap_method, "repeats": c.repeats,
        "cells": [asdict(cell) for cell in c.cells], "machine": machine_info(c.model),
        "argv": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (c.out / "run.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    if c.routing_tokens:
        say(f"routing trace ({c.routing_tokens} tokens, strace)")
        stats = routing_report(c.model, c.routing_tokens, c.out)
        say(f"  reuse {stats['prev_token_reuse']:.3f} (chance {stats['chance_reuse']}), zipf median "
            f"{stats['zipf_per_layer_median']}")
    cells_csv = c.out / "cells.csv"
    io_csv = c.out / "io.csv"
    records = []
    io_rows: list[dict[str, Any]] = []
    slice_sizes = sorted({t.expert_bytes for t in layout.experts})
    io_sizes = list(c.io_sizes) or [4096, 65536, *slice_sizes, 4 * MiB]
    with open(cells_csv, "w", newline="") as fc:
        writer = csv.DictWriter(fc, fieldnames=CELL_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for rep in range(c.repeats):
            if c.io_seconds > 0:
                rows = io_sweep(c.model, sizes=io_sizes, lanes=(1, 4), seconds=c.io_seconds, seed=c.seed + rep,
                                modes=("odirect", "pread"))
                for r in rows:
                    r["repeat"] = rep
                io_rows.extend(rows)
                _write_rows(io_csv, io_rows)
                say(f"[{rep}] io sweep: " + ", ".join(f"{r['mode']} {r['size'] // 1024}K x{r['lanes']} "
                                                      f"{r['mib_s']:.0f}" for r in rows if r["size"] in slice_sizes))
            order = list(c.cells)
            random.Random(c.seed * 7919 + rep).shuffle(order)
            for cell in order:
                cap = make_cap(c.cap_bytes if cell.capped else 0, c.cap_method)
                timeout = 120 + cell.warmup * 2 + cell.tokens * (30 if cell.kind == "mmap" else 8)
                tokens_csv = raw / f"{cell.label}-r{rep}.csv"
                record = spawn_cell(cell, c.model, cap, tokens_csv, timeout)
                flat = _flatten(record, c.model.name, rep)
                records.append(flat)
                writer.writerow(flat)
                fc.flush()
                say(f"[{rep}] {cell.label:<26} {record.get('status'):<10} {float(record.get('tok_s', 0)):8.3f} tok/s "
                    f"hit {float(record.get('cache_hit_pct', 0)):5.1f}% "
                    f"read {float(record.get('bytes_read_per_token', 0)) / MiB:7.1f} MiB/tok "
                    f"la {record.get('loadavg_before', '-')}" + (f"  {record.get('error', '')}"
                                                                  if record.get("status") != "ok" else ""))
    _merge_tokens(raw, c.out / "tokens.csv")
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (c.out / "run.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return meta


def _write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _merge_tokens(raw: Path, dest: Path) -> None:
    """All per-token CSVs in one file, with label and repeat columns."""
    files = sorted(raw.glob("*-r*.csv"))
    with open(dest, "w", newline="") as out:
        w = csv.writer(out)
        w.writerow(["label", "repeat", *TOKEN_COLUMNS])
        for p in files:
            m = re.fullmatch(r"(.+)-r(\d+)\.csv", p.name)
            if not m:
                continue
            with open(p, newline="") as f:
                for row in csv.DictReader(f):
                    w.writerow([m.group(1), m.group(2), *(row.get(c, "") for c in TOKEN_COLUMNS)])
    for p in files:
        p.unlink()
    with contextlib.suppress(OSError):
        raw.rmdir()


# ---------------------------------------------------------------------------------------------
# Summaries and plots


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


@dataclass
class Agg:
    label: str
    kind: str
    n: int
    failed: int
    tok_s: list[float]
    rows: list[dict[str, str]]

    def med(self, key: str) -> float:
        vals = [_num(r[key]) for r in self.rows if r.get("status") == "ok"]
        return statistics.median(vals) if vals else 0.0

    @property
    def tok_s_med(self) -> float:
        return statistics.median(self.tok_s) if self.tok_s else 0.0

    @property
    def spread(self) -> str:
        if not self.tok_s:
            return "-"
        return f"{min(self.tok_s):.3g}-{max(self.tok_s):.3g}"


def aggregate(cells: Sequence[dict[str, str]]) -> dict[str, Agg]:
    out: dict[str, Agg] = {}
    for r in cells:
        a = out.setdefault(r["label"], Agg(r["label"], r["kind"], 0, 0, [], []))
        a.n += 1
        a.rows.append(r)
        if r.get("status") == "ok":
            a.tok_s.append(_num(r["tok_s"]))
        else:
            a.failed += 1
    return out


def paired_ratio(cells: Sequence[dict[str, str]], num: str, den: str, key: str = "tok_s",
                 invert: bool = False) -> list[float]:
    """Per repeat num/den (the same run's cells), for medians of ratios."""
    by = {(r["label"], r["repeat"]): r for r in cells if r.get("status") == "ok"}
    out = []
    for (label, rep), r in by.items():
        if label != num or (den, rep) not in by:
            continue
        a, b = _num(r[key]), _num(by[(den, rep)][key])
        if a > 0 and b > 0:
            out.append(b / a if invert else a / b)
    return out


def _med_spread(vals: Sequence[float], fmt: str = "{:.3g}") -> str:
    if not vals:
        return "n/a"
    m = statistics.median(vals)
    return fmt.format(m) + (f" ({fmt.format(min(vals))}-{fmt.format(max(vals))})" if len(vals) > 1 else "")


def io_bandwidth(io_rows: Sequence[dict[str, str]], mode: str, size: int, lanes: int) -> list[float]:
    return [_num(r["mib_s"]) for r in io_rows
            if r["mode"] == mode and int(r["size"]) == size and int(r["lanes"]) == lanes]


def targets(out: Path) -> dict[str, Any]:
    """P1-P4 of issue 7 and the overlap ratio of issue 4 from a campaign's files."""
    cells = read_csv(out / "cells.csv")
    io_rows = read_csv(out / "io.csv") if (out / "io.csv").exists() else []
    meta = json.loads((out / "run.json").read_text())
    aggs = aggregate(cells)
    slice_size = meta["slice_bytes"][0]
    t: dict[str, Any] = {}

    def have(*labels: str) -> bool:
        return all(lbl in aggs and aggs[lbl].tok_s for lbl in labels)

    if have("fullcache-overlap", "resident") or have("fullcache-serial", "resident"):
        p1 = {lbl: paired_ratio(cells, lbl, "resident") for lbl in ("fullcache-serial", "fullcache-overlap")}
        best = max(p1, key=lambda k: statistics.median(p1[k]) if p1[k] else 0)
        t["P1"] = {"ratio": statistics.median(p1[best]) if p1[best] else 0, "by_config": p1, "config": best,
                   "target": 0.97}
    streamed = [a for a in aggs.values() if a.kind == "stream" and a.tok_s and a.rows[0].get("cap_method") != "none"
                and _num(a.rows[0].get("cap_mb")) > 0]
    if streamed and have("mmap"):
        best = max(streamed, key=lambda a: a.tok_s_med)
        t["P2"] = {"ratio": statistics.median(paired_ratio(cells, best.label, "mmap") or [0]),
                   "ratios": paired_ratio(cells, best.label, "mmap"), "config": best.label, "target": 12.0,
                   "mmap_tok_s": aggs["mmap"].tok_s, "best_tok_s": best.tok_s}
    for lanes in (4, 1):
        label = f"off-serial-od{lanes}"
        if have(label):
            achieved = [_num(r["read_mib_s"]) for r in aggs[label].rows if r.get("status") == "ok"]
            raw = io_bandwidth(io_rows, "odirect", slice_size, lanes)
            replay = [(_num(r["bytes_read_per_token"]) / MiB) / (_num(r["ms_per_token"]) / 1000)
                      for r in aggs.get(f"io-od{lanes}", Agg("", "", 0, 0, [], [])).rows if r.get("status") == "ok"]
            t[f"P3_{lanes}lane"] = {
                "engine_mib_s": achieved, "bench_io_mib_s": raw, "replay_mib_s": replay,
                "ratio": statistics.median(achieved) / statistics.median(raw) if achieved and raw else 0,
                "ratio_vs_replay": (statistics.median(achieved) / statistics.median(replay)
                                    if achieved and replay else 0),
                "target": 0.90}
    od = [a for a in aggs.values() if a.kind == "stream" and a.rows[0].get("read_path") == "odirect" and a.tok_s]
    if od:
        copy = sum(_num(r["copy_bytes_per_token"]) for a in od for r in a.rows)
        read = sum(_num(r["bytes_read_per_token"]) for a in od for r in a.rows)
        t["P4"] = {"copy_per_read_byte": copy / read if read else 0.0, "cells": len(od), "target": 0.0}
    if have("off-overlap-od4", "resident", "io-od4"):
        ov = {r["repeat"]: _num(r["ms_per_token"]) for r in aggs["off-overlap-od4"].rows if r.get("status") == "ok"}
        se = {r["repeat"]: _num(r["ms_per_token"]) for r in aggs.get("off-serial-od4", aggs["off-overlap-od4"]).rows
              if r.get("status") == "ok"}
        comp = {r["repeat"]: _num(r["ms_per_token"]) for r in aggs["resident"].rows if r.get("status") == "ok"}
        io_ = {r["repeat"]: _num(r["ms_per_token"]) for r in aggs["io-od4"].rows if r.get("status") == "ok"}
        io_nb = {r["repeat"]: _num(r["ms_per_token"]) for r in aggs.get("io-od4-nobarrier", aggs["io-od4"]).rows
                 if r.get("status") == "ok"}
        serial_rows = aggs.get("off-serial-od4", aggs["off-overlap-od4"]).rows
        eng_io = {r["repeat"]: _num(r["io_ms_per_token"]) for r in serial_rows if r.get("status") == "ok"}
        reps = sorted(set(ov) & set(comp) & set(io_))
        t["overlap"] = {
            "overlap_ms": [ov[r] for r in reps], "serial_ms": [se.get(r, 0) for r in reps],
            "compute_only_ms": [comp[r] for r in reps], "io_only_ms": [io_[r] for r in reps],
            "io_only_nobarrier_ms": [io_nb.get(r, 0) for r in reps],
            "engine_io_ms": [eng_io.get(r, 0) for r in reps],
            "ratio_vs_engine_io": statistics.median([ov[r] / max(eng_io[r], comp[r]) for r in reps if eng_io.get(r)])
            if reps else 0,
            "ratio": statistics.median([ov[r] / max(io_[r], comp[r]) for r in reps]) if reps else 0,
            "ratios": [ov[r] / max(io_[r], comp[r]) for r in reps],
            "serial_ratio": statistics.median([se[r] / max(io_[r], comp[r]) for r in reps if r in se]) if reps else 0,
            "overlap_vs_serial": statistics.median([ov[r] / se[r] for r in reps if se.get(r)]) if reps else 0,
            "target": 1.15}
    if "io-od4" in aggs and aggs["io-od4"].tok_s:
        raw = io_bandwidth(io_rows, "odirect", slice_size, 4)
        if raw:
            t["ceiling_tok_s"] = statistics.median(raw) * MiB / meta["routed_bytes_per_token"]
    return t


def summary_markdown(out: Path) -> str:
    cells = read_csv(out / "cells.csv")
    meta = json.loads((out / "run.json").read_text())
    io_rows = read_csv(out / "io.csv") if (out / "io.csv").exists() else []
    aggs = aggregate(cells)
    t = targets(out)
    mmap_med = aggs["mmap"].tok_s_med if "mmap" in aggs and aggs["mmap"].tok_s else 0
    m = meta["machine"]
    lines = [
        f"# bench stream: {Path(meta['model']).name}",
        "",
        f"- model: {meta['file_bytes'] / 1e9:.2f} GB, {meta['n_layer']} layers, {meta['n_expert']} experts, "
        f"top-{meta['n_expert_used']}, slice {meta['slice_bytes'][0]:,} B, routed "
        f"{meta['routed_bytes_per_token'] / 1e6:.1f} MB/token; routing: "
        f"{_routing_desc(meta.get('model_metadata', {}))}",
        f"- RAM cap: {meta['cap_bytes'] / MiB:.0f} MiB ({100 * meta['cap_bytes'] / meta['file_bytes']:.0f}% of the "
        f"file), method {_cap_methods(cells)}; resident and full-cache cells run without the cap",
        f"- machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('mem_total_mb')} MiB RAM, swap "
        f"{m.get('swap_total_mb')} MiB, kernel {m.get('kernel')}, device {m.get('device')} "
        f"(read_ahead {m.get('queue_read_ahead_kb')} KiB)",
        f"- {meta['repeats']} repeats, cells interleaved in a shuffled order per repeat, each in a fresh process "
        f"with the model's page cache dropped; started {meta.get('started')}",
        "",
        "| config | kind | tok/s median (min-max) | x mmap | ms/token | MiB read/token | hit % | io ms | stall ms "
        "| drain ms | compute ms | majflt/token | peak RSS MiB | cap peak MiB | threads (compute+lanes/proc) | "
        "load avg | ok/runs |",
        "|" + "---|" * 17,
    ]
    for a in sorted(aggs.values(), key=lambda a: (_KIND_ORDER.get(a.kind, 9), -a.tok_s_med)):
        ratio = paired_ratio(cells, a.label, "mmap") if mmap_med and a.label != "mmap" else []
        r0 = a.rows[0]
        lanes = r0.get("io_threads", "") if a.kind in ("stream", "io") else "0"
        thr = f"{r0.get('threads', '') or '-'}+{lanes}/{r0.get('process_threads', '')}"
        la = [_num(r["loadavg_before"]) for r in a.rows if r.get("loadavg_before")]
        read_mib = (a.med("bytes_read_per_token") or a.med("storage_bytes_per_token")) / MiB
        lines.append(
            f"| {a.label} | {a.kind} | {_med_spread(a.tok_s, '{:.3g}')} | {_med_spread(ratio, '{:.3g}')} | "
            f"{a.med('ms_per_token'):.1f} | {read_mib:.1f} | "
            f"{a.med('cache_hit_pct'):.1f} | {a.med('io_ms_per_token'):.1f} | {a.med('stall_ms_per_token'):.1f} | "
            f"{a.med('drain_ms_per_token'):.1f} | {a.med('compute_ms_per_token'):.1f} | "
            f"{a.med('major_faults_per_token'):.1f} | {a.med('peak_rss_bytes') / MiB:.0f} | "
            f"{a.med('cap_max_usage_mb'):.0f} | {thr} | {statistics.median(la) if la else 0:.2f} | "
            f"{a.n - a.failed}/{a.n} |")
    failures = [r for r in cells if r.get("status") != "ok"]
    if failures:
        lines += ["", "Failed cells:", ""]
        for r in failures:
            lines.append(f"- {r['label']} (repeat {r['repeat']}): {r['status']} — {r.get('error', '')[:300]}")
    storage = [a for a in aggs.values() if a.kind in ("mmap",) and a.tok_s]
    for a in storage:
        lines += ["", f"{a.label}: storage read per token {a.med('storage_bytes_per_token') / MiB:.0f} MiB "
                      f"(/proc/self/io), {a.med('major_faults_per_token'):.0f} major faults per token, load "
                      f"{a.med('load_s'):.1f} s reading {a.med('load_storage_bytes') / MiB:.0f} MiB."]
    if io_rows:
        lines += ["", "## Drive (bench io, same run): MiB/s median over repeats", "",
                  "| mode | size | 1 lane | 4 lanes |", "|---|---|---|---|"]
        for mode in ("odirect", "pread"):
            for size in sorted({int(r["size"]) for r in io_rows}):
                vals = [_med_spread(io_bandwidth(io_rows, mode, size, n), "{:.0f}") for n in (1, 4)]
                lines.append(f"| {mode} | {_size(size)} | {vals[0]} | {vals[1]} |")
    lines += ["", "## Targets", "", *_targets_lines(t)]
    return "\n".join(lines) + "\n"


_KIND_ORDER = {"resident": 0, "mmap": 1, "stream": 2, "io": 3}


def _size(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n / 1024:g} KiB" if n >= 1024 else f"{n} B"


def _routing_desc(md: dict[str, Any]) -> str:
    if not md.get("bmoe.routing.mode"):
        return "unknown (not a bmoe synthetic model)"
    if md["bmoe.routing.mode"] == "random":
        return "random router (uniform)"
    return (f"shaped, Zipf skew {md.get('bmoe.routing.skew', 0):.2g}, target previous-token reuse "
            f"{md.get('bmoe.routing.repeat', 0):.2g}")


def _cap_methods(cells: Sequence[dict[str, str]]) -> str:
    return ", ".join(sorted({r["cap_method"] for r in cells if r.get("cap_method") not in ("", "none")})) or "none"


def _targets_lines(t: dict[str, Any]) -> list[str]:
    out = []

    def met(v: float, target: float, higher: bool = True) -> str:
        ok = v >= target if higher else v <= target
        return "**met**" if ok else "**missed**"

    if "P1" in t:
        p = t["P1"]
        out.append(f"- P1 resident parity ({p['config']} vs resident, per-repeat ratio, median): "
                   f"{p['ratio']:.3f} (target ≥ {p['target']}) {met(p['ratio'], p['target'])}; "
                   + "; ".join(f"{k} {_med_spread(v, '{:.3f}')}" for k, v in p["by_config"].items()))
    if "P2" in t:
        p = t["P2"]
        out.append(f"- P2 under the cap, best streamed ({p['config']}) vs llama.cpp mmap, same repeat: "
                   f"{_med_spread(p['ratios'], '{:.1f}')}x (target ≥ {p['target']:g}x) {met(p['ratio'], p['target'])}")
    for key in ("P3_4lane", "P3_1lane"):
        if key in t:
            p = t[key]
            out.append(f"- {key.replace('_', ' ')}: cache-off serial O_DIRECT read bandwidth while reading "
                       f"{_med_spread(p['engine_mib_s'], '{:.0f}')} MiB/s vs bench io at the slice size "
                       f"{_med_spread(p['bench_io_mib_s'], '{:.0f}')} MiB/s = {p['ratio']:.2f} "
                       f"(target ≥ {p['target']}) {met(p['ratio'], p['target'])}; vs the engine-pattern replay "
                       f"{_med_spread(p['replay_mib_s'], '{:.0f}')} MiB/s = {p['ratio_vs_replay']:.2f}")
    if "P4" in t:
        p = t["P4"]
        out.append(f"- P4 zero copy: copy bytes per read byte on the O_DIRECT path = {p['copy_per_read_byte']:g} "
                   f"over {p['cells']} configs (target 0) {met(-p['copy_per_read_byte'], 0)}")
    if "overlap" in t:
        p = t["overlap"]
        out.append(f"- Issue 4 overlap: per-token {_med_spread(p['overlap_ms'], '{:.0f}')} ms with overlap, "
                   f"{_med_spread(p['serial_ms'], '{:.0f}')} ms serial; io-only "
                   f"{_med_spread(p['io_only_ms'], '{:.0f}')} ms (engine pattern, barrier per layer; "
                   f"{_med_spread(p['io_only_nobarrier_ms'], '{:.0f}')} ms without), "
                   f"compute-only {_med_spread(p['compute_only_ms'], '{:.0f}')} ms (resident). "
                   f"overlap / max(io, compute) = {_med_spread(p['ratios'], '{:.2f}')} (target ≤ {p['target']}) "
                   f"{met(p['ratio'], p['target'], higher=False)}; against the engine's own read time in the "
                   f"serial cache-off cell ({_med_spread(p['engine_io_ms'], '{:.0f}')} ms) as io-only: "
                   f"{p['ratio_vs_engine_io']:.2f}; serial / max = {p['serial_ratio']:.2f}; "
                   f"overlap / serial = {p['overlap_vs_serial']:.2f}")
    if "ceiling_tok_s" in t:
        out.append(f"- I/O-bound ceiling (drive O_DIRECT bandwidth at the slice size, 4 lanes / routed bytes per "
                   f"token): {t['ceiling_tok_s']:.2f} tok/s")
    return out


def plots(out: Path, routing: dict[str, Any] | None = None) -> list[Path]:
    """tokps.png (tok/s per config, mmap baseline and the I/O ceiling), hitrate.png (hit rate vs cache
    budget: measured cells and the LRU replay of the routing trace), split.png (where the time goes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = read_csv(out / "cells.csv")
    meta = json.loads((out / "run.json").read_text())
    aggs = aggregate(cells)
    t = targets(out)
    written = []
    name = Path(meta["model"]).name
    ok = sorted((a for a in aggs.values() if a.tok_s and a.kind != "io"),
                key=lambda a: (_KIND_ORDER.get(a.kind, 9), a.tok_s_med))
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(ok) + 1.8))
    colors = {"resident": "tab:green", "mmap": "tab:red", "stream": "tab:blue"}
    ys = range(len(ok))
    ax.barh(list(ys), [a.tok_s_med for a in ok], color=[colors.get(a.kind, "gray") for a in ok],
            xerr=[[a.tok_s_med - min(a.tok_s) for a in ok], [max(a.tok_s) - a.tok_s_med for a in ok]], capsize=3)
    ax.set_yticks(list(ys), [a.label + ("" if a.rows[0].get("cap_method") not in ("", "none") else " (no cap)")
                             for a in ok], fontsize=8)
    ax.set_xscale("log")
    if "mmap" in aggs and aggs["mmap"].tok_s:
        ax.axvline(aggs["mmap"].tok_s_med, color="tab:red", ls="--",
                   label=f"llama.cpp mmap {aggs['mmap'].tok_s_med:.2f}")
    if "ceiling_tok_s" in t:
        ax.axvline(t["ceiling_tok_s"], color="black", ls=":", label=f"I/O ceiling (cache off) {t['ceiling_tok_s']:.2f}")
    ax.set_xlabel("decode tok/s (median, min-max over repeats; log scale)")
    ax.set_title(f"{name}: cap {meta['cap_bytes'] / MiB:.0f} MiB ({100 * meta['cap_bytes'] / meta['file_bytes']:.0f}%)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper center", framealpha=0.9)
    fig.tight_layout()
    p = out / "tokps.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    pts = [(_num(r["cache_budget_mb"]), _num(r["cache_hit_pct"])) for r in cells
           if r.get("status") == "ok" and r["kind"] == "stream" and r.get("cap_method") not in ("", "none")]
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label="measured (under the cap)", zorder=3)
    full = [(_num(r["cache_budget_mb"]), _num(r["cache_hit_pct"])) for r in cells
            if r.get("status") == "ok" and r["label"].startswith("fullcache")]
    if full:
        ax.scatter([p[0] for p in full], [p[1] for p in full], marker="s", label="full cache, after a warm-up pass")
    routing = routing or (json.loads((out / "routing.json").read_text()) if (out / "routing.json").exists() else None)
    if routing and routing.get("lru_hit_rate"):
        curve = sorted((float(k), v) for k, v in routing["lru_hit_rate"].items())
        ax.plot([c[0] for c in curve], [c[1] for c in curve], "-", color="gray",
                label=f"LRU replay of the traced routing ({routing['tokens']} tokens, cold)")
    ax.set_xscale("symlog", linthresh=64)
    ax.set_xlabel("cache budget (MiB)")
    ax.set_ylabel("cache hit %")
    ax.set_title(f"{name}: hit rate vs cache budget", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "hitrate.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    st = sorted((a for a in aggs.values() if a.kind in ("stream", "resident") and a.tok_s),
                key=lambda a: a.med("ms_per_token"))
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(st) + 1.8))
    ys = list(range(len(st)))
    comp = [a.med("compute_ms_per_token") - a.med("drain_ms_per_token") for a in st]
    stall = [a.med("stall_ms_per_token") for a in st]
    drain = [a.med("drain_ms_per_token") for a in st]
    ax.barh(ys, comp, color="tab:green", label="compute (wall - stall - drain)")
    ax.barh(ys, stall, left=comp, color="tab:orange", label="stall (waiting for reads)")
    ax.barh(ys, drain, left=[c + s for c, s in zip(comp, stall, strict=True)], color="tab:purple",
            label="drain (previous layer's reads)")
    ax.scatter([a.med("io_ms_per_token") for a in st], ys, marker="|", s=200, color="black", zorder=3,
               label="io (reads in flight)")
    ax.set_yticks(ys, [a.label for a in st], fontsize=8)
    ax.set_xlabel("ms per token (median)")
    ax.set_title(f"{name}: where the time goes", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    p = out / "split.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written


def write_summary(out: Path, with_plots: bool = True) -> Path:
    text = summary_markdown(out)
    (out / "summary.md").write_text(text)
    (out / "targets.json").write_text(json.dumps(targets(out), indent=2) + "\n")
    if with_plots:
        plots(out)
    return out / "summary.md"


def io_summary(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| mode | size | lanes | MiB/s | p50 ms | p99 ms | reads | storage/logical |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["storage_bytes"] / r["bytes"] if r["bytes"] else 0
        lines.append(f"| {r['mode']} | {_size(int(r['size']))} | {r['lanes']} | {r['mib_s']:.0f} | {r['lat_p50_ms']} | "
                     f"{r['lat_p99_ms']} | {r['reads']} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def bench_io(model: Path, out: Path | None, *, sizes: Sequence[int] | None, lanes: Sequence[int],
             modes: Sequence[str], seconds: float, repeats: int, progress: Any = None) -> list[dict[str, Any]]:
    layout = gguf_layout(model) if str(model).endswith(".gguf") else None
    slice_sizes = sorted({t.expert_bytes for t in layout.experts}) if layout else []
    sizes = list(sizes or [4096, 65536, *slice_sizes, MiB, 4 * MiB])
    rows = io_sweep(model, sizes=sizes, lanes=lanes, modes=modes, seconds=seconds, repeats=repeats, progress=progress)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        _write_rows(out / "io.csv", rows)
        (out / "io.md").write_text(f"# bench io: {model}\n\n{json.dumps(machine_info(model))}\n\n" + io_summary(rows))
    return rows


def iter_sizes(spec: str, model: Path) -> Iterator[int]:
    for part in spec.split(","):
        part = part.strip().lower()
        if part == "slice":
            yield from sorted({t.expert_bytes for t in gguf_layout(model).experts})
        elif part.endswith("k"):
            yield int(float(part[:-1]) * 1024)
        elif part.endswith("m"):
            yield int(float(part[:-1]) * MiB)
        elif part:
            yield int(part)


if __name__ == "__main__":  # python -m bmoe_edge.bench balloon BYTES
    if len(sys.argv) == 3 and sys.argv[1] == "balloon":
        balloon_main(int(sys.argv[2]))
    else:
        sys.exit("usage: python -m bmoe_edge.bench balloon BYTES")
