"""`bench io`: the drive's raw random-read bandwidth, and the engine's read pattern replayed without
compute (per token and layer, the routed experts' slices, a barrier per layer).

The reader here (`Lanes`) reproduces the engine's O_DIRECT windows in Python: the engine's own read
lanes are not exposed through the bindings yet.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import queue
import random
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bmoe_edge.bench.layout import gguf_layout
from bmoe_edge.bench.machine import (
    MiB,
    align_down,
    align_up,
    drop_page_cache,
    loadavg,
    machine_info,
    proc_read_bytes,
    size_text,
    write_rows,
)
from bmoe_edge.errors import BmoeError


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
        self._bufs = [mmap.mmap(-1, align_up(max_length + 2 * max(self.align, page), page) + page)
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
        start = align_down(offset, self.align)
        end = min(align_up(offset + length, self.align), align_down(self.size, self.align))
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
            slot = align_up(size, 4096)
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


def io_summary(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| mode | size | lanes | MiB/s | p50 ms | p99 ms | reads | storage/logical |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["storage_bytes"] / r["bytes"] if r["bytes"] else 0
        lines.append(f"| {r['mode']} | {size_text(int(r['size']))} | {r['lanes']} | {r['mib_s']:.0f} | "
                     f"{r['lat_p50_ms']} | {r['lat_p99_ms']} | {r['reads']} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def bench_io(model: Path, out: Path | None, *, sizes: Sequence[int] | None, lanes: Sequence[int],
             modes: Sequence[str], seconds: float, repeats: int, progress: Any = None) -> list[dict[str, Any]]:
    layout = gguf_layout(model) if str(model).endswith(".gguf") else None
    slice_sizes = sorted({t.expert_bytes for t in layout.experts}) if layout else []
    sizes = list(sizes or [4096, 65536, *slice_sizes, MiB, 4 * MiB])
    rows = io_sweep(model, sizes=sizes, lanes=lanes, modes=modes, seconds=seconds, repeats=repeats, progress=progress)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_rows(out / "io.csv", rows)
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

