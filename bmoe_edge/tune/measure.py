"""What `bmoe-edge tune` measures on the machine it runs on (standard library, the engine and bench's
board side only: it runs on a board). The choice rules are rules.py, the profile it writes user_profile.py.

- **memory**: RAM and MemAvailable, the page size, and every memory limit that applies to this process
  (`engine.memlimits.memory_limits`: the memory cgroup it is in and its ancestors, v2 `memory.max`/`memory.high`
  and v1 `memory.limit_in_bytes`); the smallest of them and the RAM is the effective limit;
- **reads**: random reads of each slice size with 1..N lanes (N = 2x the cores, at most 8), O_DIRECT
  and pread, cold (O_DIRECT never uses the page cache; pread cells start from a file whose pages were
  dropped with posix_fadvise DONTNEED, and no slot is read twice in a cell) — `io.io_sweep`, three
  interleaved sweeps, the median of each cell (one with `--quick`). The sizes are the model's expert
  slice sizes (`-m`), else real models' (648 KiB, 1.7 MiB); the file read is the model, else a scratch
  file of random bytes written (and removed) in `--dir`;
- **compute**: decode tok/s with 1..cores threads, every round kept (the spread decides ties), of a
  model with real layers: the `-m` model, else a benchmark-shaped one (the caller writes it once).
  Streaming (the way runs use threads: beside the read lanes, no expert cache, so every token reads its
  experts), and resident too when the model takes at most 40% of the free memory.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import struct
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bmoe_edge.bench.io import io_sweep
from bmoe_edge.bench.layout import gguf_layout
from bmoe_edge.bench.machine import PROMPT, mem_info
from bmoe_edge.engine import Engine
from bmoe_edge.engine.memlimits import MemoryLimit, memory_limits, memory_pressure
from bmoe_edge.errors import BmoeError
from bmoe_edge.units import KiB, MiB, size_text

DEFAULT_SIZES = (648 * KiB, 1740 * KiB)   # a 30B-A3B Q4_0 gate/up slice, a large one
QUICK_SIZES = (648 * KiB,)
TINY_SLICE = 128 * KiB      # a model whose largest slice is below this is a toy: its reads are IOPS-bound
MANY_TIMES = 16             # a model whose file fits this many times in the memory limit is a toy for compute
MAX_SIZES = 3               # of a model's distinct slice sizes: the smallest, the median, the largest
MAX_LANES = 8
FAR_BEHIND = 0.5           # compute: a count at less than half another's is not measured again
FIT_FRACTION = 0.4         # -m is the compute probe too when its file takes at most 40% of free memory

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------------
# What a run measures and how much of it.


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...]
    lanes: tuple[int, ...]
    threads: tuple[int, ...]
    seconds: float           # per read cell (at most)
    scratch_bytes: int       # scratch file (no -m)
    tokens: int              # decode tokens per compute cell
    rounds: int              # compute rounds (all kept: their spread decides ties)
    repeats: int = 1         # read sweeps, interleaved (the median of each cell)


def make_plan(quick: bool, cores: int, model_sizes: Sequence[int] = ()) -> Plan:
    sizes = tuple(model_sizes) or (QUICK_SIZES if quick else DEFAULT_SIZES)
    if quick:
        sizes = sizes[-1:]
    lanes = tuple(range(1, min(2 * cores, MAX_LANES) + 1))
    threads = tuple(range(1, max(cores, 1) + 1))
    if quick:
        return Plan(sizes, lanes, threads, seconds=0.15, scratch_bytes=16 * MiB, tokens=4, rounds=1)
    return Plan(sizes, lanes, threads, seconds=1.0, scratch_bytes=256 * MiB, tokens=12, rounds=3, repeats=3)


def model_slice_sizes(model: Path) -> tuple[int, ...]:
    """Up to three of the model's distinct expert slice sizes (smallest, median, largest)."""
    try:
        layout = gguf_layout(model)
    except (OSError, ValueError, struct.error) as exc:   # a truncated or garbled header
        raise BmoeError(f"{model}: not a readable gguf ({exc})") from None
    distinct = sorted({t.slice_bytes for t in layout.experts})
    if not distinct:
        raise BmoeError(f"{model}: no expert tensors (a dense model has nothing to stream)")
    if len(distinct) > MAX_SIZES:
        distinct = [distinct[0], distinct[len(distinct) // 2], distinct[-1]]
    return tuple(distinct)


# ---------------------------------------------------------------------------------------------------
# Memory.


@dataclass(frozen=True)
class Machine:
    hostname: str
    arch: str
    cores: int
    ram_mb: int
    available_mb: int
    page_size: int
    limits: tuple[MemoryLimit, ...]
    pressure_avg10: float | None     # PSI "some" avg10 of memory, when the kernel has it

    @property
    def effective_mb(self) -> int:
        return min([self.ram_mb, *(lim.mb for lim in self.limits)])


def machine_facts() -> Machine:
    info = mem_info()
    return Machine(
        hostname=platform.node(), arch=platform.machine(), cores=os.cpu_count() or 1,
        ram_mb=info.get("MemTotal", 0) // MiB, available_mb=info.get("MemAvailable", 0) // MiB,
        page_size=os.sysconf("SC_PAGE_SIZE"), limits=memory_limits(), pressure_avg10=memory_pressure(),
    )


# ---------------------------------------------------------------------------------------------------
# Reads.


@dataclass(frozen=True)
class IoCell:
    mode: str       # odirect | pread
    size: int
    lanes: int
    mib_s: float
    reads: int


def check_readable(path: Path, need: int) -> int:
    """The file's size; a one-line BmoeError when it cannot be read or is too small to measure."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise BmoeError(f"cannot read {path}: {exc.strerror}") from None
    try:
        size = os.fstat(fd).st_size
        os.pread(fd, 4096, 0)
    except OSError as exc:
        raise BmoeError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size < need:
        raise BmoeError(f"{path} has {size} bytes: too small to measure reads of {need} bytes")
    return size


def odirect_unavailable(path: Path) -> str:
    """Why O_DIRECT cannot read `path` ('' when it can): one aligned read, as the engine's probe does."""
    import mmap

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        return f"O_DIRECT open failed: {exc.strerror}"
    buf = mmap.mmap(-1, 64 * KiB)
    try:
        os.preadv(fd, [memoryview(buf)[:4096]], 0)
    except OSError as exc:
        return f"O_DIRECT read failed: {exc.strerror}"
    finally:
        os.close(fd)
        buf.close()
    return ""


@contextlib.contextmanager
def scratch_file(directory: Path, size: int) -> Iterator[Path]:
    """A file of `size` random bytes in `directory` (written through, synced), removed afterwards."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".bmoe-tune-", suffix=".scratch", dir=directory)
    except OSError as exc:
        raise BmoeError(f"cannot write a scratch file in {directory}: {exc.strerror}; pass --dir on the disk the "
                        "models are on, or -m MODEL") from None
    path = Path(name)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                chunk = 4 * MiB
                for done in range(0, size, chunk):
                    f.write(os.urandom(min(chunk, size - done)))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise BmoeError(f"cannot write a scratch file in {directory}: {exc.strerror}") from None
        yield path
    finally:
        path.unlink(missing_ok=True)


def measure_io(path: Path, plan: Plan, progress: Progress = quiet) -> tuple[list[IoCell], str]:
    """Cold random reads of each size with each lane count, O_DIRECT (when available) and pread."""
    why_not = odirect_unavailable(path)
    modes = ["pread"] if why_not else ["odirect", "pread"]
    if why_not:
        progress(f"  {why_not}: measuring pread only")

    def show(row: dict[str, Any]) -> None:
        size = size_text(int(row["size"]))
        progress(f"  {row['mode']:<7} {size:>8} x {row['lanes']} lane(s): {row['mib_s']:8.1f} MiB/s")

    try:
        rows = io_sweep(path, sizes=plan.sizes, lanes=plan.lanes, modes=modes, seconds=plan.seconds,
                              repeats=plan.repeats, progress=show)
    except OSError as exc:
        raise BmoeError(f"cannot read {path}: {exc.strerror or exc}") from None
    except BmoeError as exc:     # a read that failed mid-sweep (an I/O error)
        raise BmoeError(f"cannot read {path}: {exc}") from None
    by: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["mode"], int(r["size"]), int(r["lanes"])), []).append(r)
    cells = [IoCell(mode, size, lanes, round(statistics.median(float(r["mib_s"]) for r in rs), 2),
                    sum(int(r["reads"]) for r in rs)) for (mode, size, lanes), rs in by.items()]
    cells.sort(key=lambda c: (c.mode != "odirect", c.size, c.lanes))
    return cells, why_not


# ---------------------------------------------------------------------------------------------------
# Compute.


@dataclass(frozen=True)
class ComputeCell:
    threads: int
    tok_s: float                     # the median of the rounds
    mode: str = "resident"           # stream | resident
    samples: tuple[float, ...] = ()  # every round's tok/s

    @property
    def low(self) -> float:
        return min(self.samples, default=self.tok_s)

    @property
    def high(self) -> float:
        return max(self.samples, default=self.tok_s)


def fits_in_memory(model: Path, machine: Machine) -> bool:
    """A model small enough to also measure resident: at most FIT_FRACTION of the memory free for it."""
    free_mb = min(machine.available_mb, machine.effective_mb)
    return model.stat().st_size <= FIT_FRACTION * free_mb * MiB


def toy_reasons(model: Path, sizes: Sequence[int], machine: Machine) -> dict[str, str]:
    """Why a model's figures would not carry over to real models: 'reads' (its slices are tiny: the
    reads are IOPS-bound) and 'compute' (its layers are tiny, or it fits in memory many times over)."""
    why: dict[str, str] = {}
    file_bytes = model.stat().st_size
    if max(sizes) < TINY_SLICE:
        why["reads"] = (f"its expert slices are at most {size_text(max(sizes))} (real models' are hundreds of "
                        "KiB to MiB): reads that small are bound by the request rate, not the bandwidth")
        why["compute"] = "its layers are tiny: thread start-up, not matrix work, decides the thread count"
    elif file_bytes * MANY_TIMES <= machine.effective_mb * MiB:
        why["compute"] = (f"it fits in memory {machine.effective_mb * MiB // file_bytes} times over "
                          f"({size_text(file_bytes)}): the models this machine streams are larger")
    return why


def measure_compute(model: Path, configs: Sequence[tuple[str, Any]], plan: Plan,
                    progress: Progress = quiet) -> list[ComputeCell]:
    """Decode tok/s of `model` for each (mode, StreamConfig without threads) with each thread count,
    `plan.rounds` rounds interleaved (every round kept: their spread is what a tie is)."""
    got: dict[tuple[str, int], list[float]] = {}
    for _round in range(plan.rounds):
        for mode, base in configs:
            for threads in plan.threads:
                if _round and _far_behind(got, mode, threads):
                    continue
                with Engine(model, replace(base, threads=threads)) as engine:
                    gen = engine.run(PROMPT, plan.tokens + 1)
                decode = gen.metrics[1:]    # the first step evaluates the prompt
                ms = sum(m.wall_ms for m in decode)
                if not decode or ms <= 0:
                    raise BmoeError(f"{model}: the compute model generated no decode steps")
                tok_s = 1000.0 * len(decode) / ms
                got.setdefault((mode, threads), []).append(round(tok_s, 2))
                progress(f"  {mode:<8} {threads} thread(s): {tok_s:8.2f} tok/s")
    return [ComputeCell(t, round(statistics.median(v), 2), mode, tuple(v)) for (mode, t), v in got.items()]


def _far_behind(got: dict[tuple[str, int], list[float]], mode: str, threads: int) -> bool:
    """A count whose best round is below FAR_BEHIND of another count's worst is far behind: it is not
    measured again (a busy machine makes an extra thread 10x slower, and its cells the longest)."""
    mine = max(got[(mode, threads)])
    return any(min(v) * FAR_BEHIND > mine for (m, t), v in got.items() if m == mode and t != threads)
