"""`bmoe-edge tune`: measure the machine it runs on (or a board over SSH) and write a user profile.

What it measures, in this order (standard library and the engine only: it runs on a board):

- **memory**: RAM and MemAvailable (/proc/meminfo), the page size, and every memory limit that applies
  to this process: the memory cgroup it is in and its ancestors, v2 (`memory.max`, `memory.high`) and
  v1 (`memory.limit_in_bytes`); the smallest of them and the RAM is the effective limit;
- **reads**: random reads of each slice size with 1..N lanes (N = 2x the cores, at most 8), O_DIRECT
  and pread, cold (O_DIRECT never uses the page cache; pread cells start from a file whose pages were
  dropped with posix_fadvise DONTNEED, and no slot is read twice in a cell) — `bench.io_sweep`, three
  interleaved sweeps, the median of each cell (one with `--quick`). The
  sizes are the model's expert slice sizes (`-m`), else a representative set; the file read is the
  model, else a scratch file of random bytes written (and removed) in `--dir`;
- **compute**: resident decode tok/s with 1..cores threads, best of the rounds, of the model when it
  takes at most 40% of the free memory, else of a tiny fixture (tiny-qwen3moe-Q8_0: a bundle's
  fixtures/ on a board, generated here on a build machine). The fixture's layers are 64 wide: it
  measures the engine and thread overhead more than matrix throughput, so it tends to favour few threads.

What it chooses (`choose`):

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

It writes `<board>.yaml` (`extends: <board>`, those fields, the measurements as comments) into the user
profile directory (`profiles.user_dir()`), or `--out FILE`, atomically and only at the end, after the
profile resolved. With a board over SSH (`tune_remote`), the deployed release's `bmoe-edge tune` runs
there (`--json --no-write`), and the profile it returns is written both here and in the board's own user
profile directory.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bmoe_edge import profiles
from bmoe_edge.errors import BmoeError

KiB = 1 << 10
MiB = 1 << 20
DEFAULT_SIZES = (256 * KiB, 648 * KiB, 1740 * KiB)   # small, a 30B-A3B Q4_0 gate/up slice, a large one
QUICK_SIZES = (648 * KiB,)
MAX_SIZES = 3               # of a model's distinct slice sizes: the smallest, the median, the largest
MAX_LANES = 8
LANE_TOLERANCE = 0.95       # the fewest lanes within 5% of the best bandwidth
PREAD_ADVANTAGE = 1.10      # pread is chosen only when it is more than 10% faster than O_DIRECT
MARGIN_BASE_MB = 64
MARGIN_LIMIT_FRACTION = 0.01
UNLIMITED = 1 << 60         # cgroup "max" / v1's 2^63 - page
FIT_FRACTION = 0.4         # -m is the compute probe too when its file takes at most 40% of free memory
PROMPT = "Once upon a time"
REMOTE_TIMEOUT = 3600.0

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
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
    rounds: int              # compute rounds (best of)
    repeats: int = 1         # read sweeps, interleaved (the median of each cell)


def make_plan(quick: bool, cores: int, model_sizes: Sequence[int] = ()) -> Plan:
    sizes = tuple(model_sizes) or (QUICK_SIZES if quick else DEFAULT_SIZES)
    if quick:
        sizes = sizes[-1:]
    lanes = tuple(range(1, min(2 * cores, MAX_LANES) + 1))
    threads = tuple(range(1, max(cores, 1) + 1))
    if quick:
        return Plan(sizes, lanes, threads, seconds=0.15, scratch_bytes=16 * MiB, tokens=4, rounds=1)
    return Plan(sizes, lanes, threads, seconds=1.0, scratch_bytes=256 * MiB, tokens=16, rounds=2, repeats=3)


def model_slice_sizes(model: Path) -> tuple[int, ...]:
    """Up to three of the model's distinct expert slice sizes (smallest, median, largest)."""
    from bmoe_edge import bench

    try:
        layout = bench.gguf_layout(model)
    except (OSError, ValueError, struct.error) as exc:   # a truncated or garbled header
        raise BmoeError(f"{model}: not a readable gguf ({exc})") from None
    distinct = sorted({t.expert_bytes for t in layout.experts})
    if not distinct:
        raise BmoeError(f"{model}: no expert tensors (a dense model has nothing to stream)")
    if len(distinct) > MAX_SIZES:
        distinct = [distinct[0], distinct[len(distinct) // 2], distinct[-1]]
    return tuple(distinct)


# ---------------------------------------------------------------------------------------------------
# Memory.


@dataclass(frozen=True)
class MemoryLimit:
    source: str     # e.g. "cgroup v2 /sys/fs/cgroup/user.slice memory.max"
    mb: int


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


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * 1024
    return out


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return value if value < UNLIMITED else None


def _mounts() -> list[tuple[str, str, str, list[str]]]:
    """(root, mount point, fs type, super options) of every mount, from /proc/self/mountinfo."""
    out = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if "-" not in parts:
                continue
            sep = parts.index("-")
            out.append((parts[3], parts[4], parts[sep + 1], parts[sep + 3].split(",") if len(parts) > sep + 3 else []))
    return out


def _ancestors(mount: str, root: str, cgroup: str) -> list[Path]:
    """The cgroup's directory under its mount and every ancestor up to the mount, innermost first."""
    rel = cgroup[len(root):] if root != "/" and cgroup.startswith(root) else cgroup
    parts = [p for p in rel.split("/") if p]
    return [Path(mount, *parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_limits() -> tuple[MemoryLimit, ...]:
    """Every memory limit of the cgroups this process is in, v2 and v1, with their ancestors."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return ()
    v2 = v1 = None
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    found: list[MemoryLimit] = []
    for root, mount, fstype, options in _mounts():
        if fstype == "cgroup2" and v2 is not None:
            for d in _ancestors(mount, root, v2):
                for name in ("memory.max", "memory.high"):
                    value = _read_limit(d / name)
                    if value is not None:
                        found.append(MemoryLimit(f"cgroup v2 {d} {name}", value // MiB))
        elif fstype == "cgroup" and "memory" in options and v1 is not None:
            for d in _ancestors(mount, root, v1):
                value = _read_limit(d / "memory.limit_in_bytes")
                if value is not None:
                    found.append(MemoryLimit(f"cgroup v1 {d} memory.limit_in_bytes", value // MiB))
    return tuple(dict.fromkeys(found))


def _pressure() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/pressure/memory").read_text().splitlines():
            if line.startswith("some "):
                return float(line.split()[1].partition("=")[2])
    return None


def machine_facts() -> Machine:
    info = _meminfo()
    return Machine(
        hostname=platform.node(), arch=platform.machine(), cores=os.cpu_count() or 1,
        ram_mb=info.get("MemTotal", 0) // MiB, available_mb=info.get("MemAvailable", 0) // MiB,
        page_size=os.sysconf("SC_PAGE_SIZE"), limits=cgroup_limits(), pressure_avg10=_pressure(),
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
def scratch_file(directory: Path, size: int):
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


def measure_io(path: Path, plan: Plan, progress: Progress = _quiet) -> tuple[list[IoCell], str]:
    """Cold random reads of each size with each lane count, O_DIRECT (when available) and pread."""
    from bmoe_edge import bench

    why_not = odirect_unavailable(path)
    modes = ["pread"] if why_not else ["odirect", "pread"]
    if why_not:
        progress(f"  {why_not}: measuring pread only")

    def show(row: dict[str, Any]) -> None:
        progress(f"  {row['mode']:<7} {_size(int(row['size'])):>8} x {row['lanes']} lane(s): {row['mib_s']:8.1f} MiB/s")

    try:
        rows = bench.io_sweep(path, sizes=plan.sizes, lanes=plan.lanes, modes=modes, seconds=plan.seconds,
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
    tok_s: float


def release_dir() -> Path | None:
    """The deployed release this code runs from ($BMOE_EDGE_RELEASE, or <release>/site/bmoe_edge/)."""
    env = os.environ.get("BMOE_EDGE_RELEASE")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parent.parent.parent)
    for rel in candidates:
        if (rel / "manifest.json").is_file() and (rel / "site").is_dir():
            return rel
    return None


def default_board() -> str:
    """The board this runs on: the deployed release's (its manifest), else `host`."""
    rel = release_dir()
    if rel is not None:
        with contextlib.suppress(OSError, ValueError):
            board = json.loads((rel / "manifest.json").read_text()).get("board")
            if isinstance(board, str) and board:
                return board
    return "host"


def compute_fixture() -> Path:
    """The tiny fixture the compute cells run: a bundle's (on a board), else generated here (cached)."""
    from bmoe_edge import gates

    spec = gates.FixtureSpec("qwen3moe", "Q8_0")
    dirs = [os.environ.get("BMOE_EDGE_FIXTURES", "")]
    rel = release_dir()
    if rel is not None:
        dirs.append(str(rel / "fixtures"))
    for d in dirs:
        if d and (Path(d) / spec.filenames[0]).is_file():
            return Path(d) / spec.filenames[0]
    try:
        return gates.host_fixture_paths(spec)[0]
    except ImportError as exc:
        raise BmoeError(f"no compute fixture here ({spec.filenames[0]} is in a board bundle's fixtures/; "
                        f"generating it needs the host extra: {exc.name} is missing)") from None


def fits_in_memory(model: Path, machine: Machine) -> bool:
    """A model small enough to measure resident (at most FIT_FRACTION of the memory free for it) is a
    better compute probe than the tiny fixture, whose 64-wide layers measure thread overhead."""
    free_mb = min(machine.available_mb, machine.effective_mb)
    return model.stat().st_size <= FIT_FRACTION * free_mb * MiB


def measure_compute(fixture: Path, plan: Plan, progress: Progress = _quiet) -> list[ComputeCell]:
    """Resident decode tok/s of the fixture with each thread count, the best of `plan.rounds` rounds."""
    from bmoe_edge.engine import Engine, StreamConfig

    best: dict[int, float] = {}
    for _round in range(plan.rounds):
        for threads in plan.threads:
            config = StreamConfig(stream=False, threads=threads, ctx=256, batch=64, ubatch=64)
            with Engine(fixture, config) as engine:
                gen = engine.run(PROMPT, plan.tokens + 1)
            decode = gen.metrics[1:]    # the first step evaluates the prompt
            ms = sum(m.wall_ms for m in decode)
            if not decode or ms <= 0:
                raise BmoeError(f"{fixture}: the compute fixture generated no decode steps")
            tok_s = 1000.0 * len(decode) / ms
            best[threads] = max(best.get(threads, 0.0), tok_s)
            progress(f"  compute {threads} thread(s): {tok_s:8.1f} tok/s")
    return [ComputeCell(t, round(best[t], 2)) for t in plan.threads]


# ---------------------------------------------------------------------------------------------------
# Choosing.


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


# ---------------------------------------------------------------------------------------------------
# The result, the profile text, writing it.


@dataclass(frozen=True)
class TuneResult:
    board: str
    where: str                      # "this machine" or the board's label
    read_file: str                  # the model, or "scratch file in DIR"
    sizes: tuple[int, ...]
    io: tuple[IoCell, ...]
    odirect_note: str
    fixture: str
    compute: tuple[ComputeCell, ...]
    machine: Machine
    before: dict[str, Any]          # the profile's values of what tune sets
    choice: Choice
    measured_at: str
    profile_yaml: str = ""
    written: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str) -> TuneResult:
        d = json.loads(text)
        m = d["machine"]
        machine = Machine(**{**m, "limits": tuple(MemoryLimit(**x) for x in m["limits"])})
        return TuneResult(**{
            **d, "sizes": tuple(d["sizes"]), "io": tuple(IoCell(**c) for c in d["io"]),
            "compute": tuple(ComputeCell(**c) for c in d["compute"]), "machine": machine,
            "choice": Choice(**d["choice"]), "written": tuple(d["written"]),
        })


def _size(n: int) -> str:
    if n >= MiB:
        return f"{n / MiB:.1f} MiB"
    return f"{n / KiB:.0f} KiB" if n >= KiB else f"{n} B"


def _before(profile: profiles.BoardProfile) -> dict[str, Any]:
    return {"io_threads": profile.io_threads, "threads": profile.threads, "read_path": profile.read_path,
            "read_mb_s": profile.storage.read_mb_s, "cache_margin_mb": profile.cache_margin_mb,
            "page_size": profile.page_size}


def profile_fields(board: str, choice: Choice) -> dict[str, Any]:
    data: dict[str, Any] = {"extends": board, "io_threads": choice.io_threads, "threads": choice.threads,
                            "read_path": choice.read_path, "storage": {"read_mb_s": choice.read_mb_s},
                            "cache_margin_mb": choice.cache_margin_mb}
    if choice.page_size is not None:
        data["page_size"] = choice.page_size
    return data


def render_profile(r: TuneResult) -> str:
    """The user profile: `extends` the board's, the chosen fields, what was measured as comments."""
    m = r.machine
    limits = ", ".join(f"{lim.mb} MiB ({lim.source})" for lim in m.limits) or "no memory cgroup limit"
    curves = {mode: lane_curve(r.io, mode) for mode in ("odirect", "pread")}
    lines = [
        f"# Written by `bmoe-edge tune` at {r.measured_at} on {m.hostname} ({m.arch}, {m.cores} cores, "
        f"{m.ram_mb} MiB RAM, {m.page_size // KiB} KiB pages;",
        f"# limits: {limits}).",
        f"# It layers what was measured on the `{r.board}` profile; run `bmoe-edge tune` again to refresh it,",
        "# delete this file to go back to the profile's own values.",
        f"# reads of {', '.join(_size(s) for s in r.sizes)} from {r.read_file}, MiB/s by lanes:",
    ]
    for mode, curve in curves.items():
        if curve:
            lines.append(f"#   {mode:<7} " + ", ".join(f"{n}: {v:.0f}" for n, v in curve.items()))
    if r.odirect_note:
        lines.append(f"#   {r.odirect_note}")
    lines.append(f"# resident decode of {Path(r.fixture).name}, tok/s by threads: "
                 + ", ".join(f"{c.threads}: {c.tok_s:.1f}" for c in r.compute))
    body = yaml.safe_dump(profile_fields(r.board, r.choice), sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + "\n" + body


def check_profile(text: str, name: str, exclude: Path | None) -> profiles.BoardProfile:
    """Resolve the profile text as file `<name>.yaml` against the search path without `exclude` (the
    directory it will replace a file in: `extends: <name>` then means the profile under it)."""
    skip = exclude.resolve() if exclude is not None else None
    dirs = [d for d in profiles.profile_dirs() if d != skip]
    with tempfile.TemporaryDirectory(prefix="bmoe-tune-") as tmp:
        path = Path(tmp) / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            return profiles.load_profile_file(path, dirs)
        except BmoeError as exc:
            raise BmoeError(f"the tuned profile does not resolve: {str(exc).replace(str(path), name + '.yaml')}") \
                from None


def destination(board: str, out: Path | None) -> Path:
    if out is not None:
        if not out.name.endswith(profiles.SUFFIX):
            raise BmoeError(f"--out {out}: a profile file name ends in {profiles.SUFFIX} (its name is the profile's)")
        return out
    user = profiles.user_dir()
    if user is None:
        raise BmoeError("no user profile directory: neither $XDG_CONFIG_HOME nor $HOME is set; pass --out FILE")
    return user / f"{board}{profiles.SUFFIX}"


def check_writable(dest: Path) -> None:
    """Fail before measuring when the profile could not be written (its nearest existing directory)."""
    d = dest.parent
    while not d.exists() and d != d.parent:
        d = d.parent
    try:   # a real try (access(2) says yes to root everywhere), leaving nothing behind
        Path(tempfile.mkdtemp(prefix=".bmoe-tune-", dir=d)).rmdir()
    except OSError as exc:
        raise BmoeError(f"cannot write {dest}: {d}: {exc.strerror}") from None


@contextlib.contextmanager
def staged(dest: Path, text: str):
    """Write `text` next to `dest` under a temporary name; the caller commits with `commit(tmp, dest)`.
    Nothing is left behind when the block fails."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise BmoeError(f"cannot write {dest}: {exc.strerror}") from None
    tmp = Path(name)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def commit(tmp: Path, dest: Path) -> None:
    try:
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except OSError as exc:
        raise BmoeError(f"cannot write {dest}: {exc.strerror}") from None


# ---------------------------------------------------------------------------------------------------
# This machine.


def tune_local(board: str | None = None, *, model: Path | None = None, out: Path | None = None,
               quick: bool = False, scratch_dir: Path | None = None, write: bool = True,
               progress: Progress = _quiet) -> TuneResult:
    """Measure this machine, choose, write the profile (unless `write` is false); the inputs are checked
    before anything is measured, and the file is written only at the end."""
    name = board or default_board()
    profile = profiles.load_profile(name)
    dest = destination(name, out) if write else None
    if dest is not None:
        check_writable(dest)
    machine = machine_facts()
    sizes = ()
    if model is not None:
        check_readable(model, 1)
        sizes = model_slice_sizes(model)
    plan = make_plan(quick, machine.cores, sizes)
    if model is not None:
        check_readable(model, max(plan.sizes))
    fixture = model if model is not None and fits_in_memory(model, machine) else compute_fixture()
    where = scratch_dir or _cache_dir()
    with contextlib.ExitStack() as stack:
        if model is not None:
            path, read_file = model, str(model)
        else:
            path = stack.enter_context(scratch_file(where, plan.scratch_bytes))
            read_file = f"a {_size(plan.scratch_bytes)} scratch file in {where}"
        progress(f"tuning {name} on {machine.hostname}: {machine.cores} cores, {machine.ram_mb} MiB RAM, "
                 f"{machine.page_size // KiB} KiB pages, effective memory limit {machine.effective_mb} MiB")
        progress(f"reads ({read_file}):")
        io, note = measure_io(path, plan, progress)
    progress(f"compute ({fixture.name}, resident):")
    compute = measure_compute(fixture, plan, progress)
    choice = choose(io, note, compute, machine, plan.sizes, profile.page_size)
    result = TuneResult(
        board=name, where="this machine", read_file=read_file, sizes=plan.sizes, io=tuple(io), odirect_note=note,
        fixture=str(fixture), compute=tuple(compute), machine=machine, before=_before(profile), choice=choice,
        measured_at=time.strftime("%Y-%m-%d %H:%M %Z"),
    )
    text = render_profile(result)
    result = replace(result, profile_yaml=text)
    check_profile(text, dest.stem if dest else name, dest.parent if dest else None)
    if dest is None:
        return result
    with staged(dest, text) as tmp:
        commit(tmp, dest)
    return replace(result, written=(str(dest),))


def _cache_dir() -> Path:
    return Path(os.environ.get("BMOE_EDGE_CACHE") or Path.home() / ".cache" / "bmoe-edge")


# ---------------------------------------------------------------------------------------------------
# A board over SSH.


def tune_remote(target: Any, *, options: Any, board: str | None = None, install_dir: str | None = None,
                model: str | None = None, scratch_dir: str | None = None, out: Path | None = None,
                quick: bool = False, progress: Progress = _quiet) -> TuneResult:
    """Run the deployed release's `bmoe-edge tune` on the board, then write the profile it measured here
    and in the board's user profile directory (both only after the board's run succeeded and the profile
    resolved here)."""
    from bmoe_edge import deploy, remote

    conn, layout = deploy.connect(target, options, board, install_dir)
    with conn:
        _rid, rel, manifest = deploy.current_release(conn, layout)
        if board and board != manifest.board:
            raise BmoeError(f"{conn.label}: the deployed release is for board {manifest.board}, not {board}")
        name = manifest.board
        dest = destination(name, out)
        args = ["tune", "--board", name, "--json", "--no-write", *(["--quick"] if quick else []),
                *(["-m", model] if model else []), *(["--dir", scratch_dir] if scratch_dir else [])]
        progress(f"tuning {conn.label} (board {name}, release {_rid}) ...")
        result = deploy.run_release(conn, rel, args, what="tune", timeout=REMOTE_TIMEOUT)
        if result.exited != 0:
            why = remote.tail(result.stderr or result.stdout).removeprefix("error: ")
            if "No such command" in why:
                why += " (the deployed release predates `tune`: build and deploy again)"
            raise BmoeError(f"{conn.label}: tune failed: {why}")
        try:
            measured = TuneResult.from_json(result.stdout)
        except (ValueError, KeyError, TypeError) as exc:
            raise BmoeError(f"{conn.label}: tune printed no report ({exc}): {remote.tail(result.stdout)}") from None
        text = measured.profile_yaml
        check_profile(text, dest.stem, dest.parent)
        home = conn.sh(deploy.CONFIG_HOME_SCRIPT, what="finding ~/.config").stdout.strip()
        if not home.startswith("/"):
            raise BmoeError(f"{conn.label}: no home directory to write the profile in ({home!r})")
        board_dir = f"{home}/bmoe-edge/profiles"
        board_file = f"{board_dir}/{name}{profiles.SUFFIX}"
        with staged(dest, text) as tmp:
            conn.sh('mkdir -p -- "$1"', board_dir, what=f"creating {board_dir}")
            conn.write_bytes(board_file, text.encode())
            commit(tmp, dest)
    return replace(measured, where=conn.label, written=(str(dest), f"{conn.label}:{board_file}"))


# ---------------------------------------------------------------------------------------------------
# The table.


def format_table(r: TuneResult) -> str:
    m = r.machine
    out = [f"tune: {r.board} on {r.where} ({m.hostname}, {m.arch}, {m.cores} cores)", ""]
    out.append("memory")
    out.append(f"  RAM {m.ram_mb} MiB, available {m.available_mb} MiB, page size {m.page_size // KiB} KiB"
               + (f", pressure avg10 {m.pressure_avg10:.2f}%" if m.pressure_avg10 is not None else ""))
    for lim in m.limits:
        out.append(f"  limit {lim.mb} MiB: {lim.source}")
    out.append(f"  effective limit {m.effective_mb} MiB" + ("" if m.limits else " (no memory cgroup limit)"))
    out.append("")
    out.append(f"reads, MiB/s ({r.read_file})")
    lanes = sorted({c.lanes for c in r.io})
    rows = [["path", "size", *(f"{n} lane{'s' if n > 1 else ''}" for n in lanes)]]
    for mode in ("odirect", "pread"):
        for size in r.sizes:
            cells = {c.lanes: c.mib_s for c in r.io if c.mode == mode and c.size == size}
            if cells:
                rows.append([mode, _size(size), *(f"{cells[n]:.0f}" if n in cells else "-" for n in lanes)])
    out += _grid(rows)
    if r.odirect_note:
        out.append(f"  {r.odirect_note}")
    out.append("")
    out.append(f"compute, resident decode tok/s ({Path(r.fixture).name})")
    out += _grid([["threads", *(str(c.threads) for c in r.compute)],
                  ["tok/s", *(f"{c.tok_s:.1f}" for c in r.compute)]])
    out.append("")
    out.append("chosen")
    c = r.choice
    chosen = [("read_path", c.read_path), ("io_threads", c.io_threads), ("storage.read_mb_s", c.read_mb_s),
              ("threads", c.threads), ("cache_margin_mb", c.cache_margin_mb)]
    if c.page_size is not None:
        chosen.append(("page_size", c.page_size))
    rows = [["field", "was", "now", "why"]]
    for key, value in chosen:
        was = r.before.get(key.removeprefix("storage."))
        shown = str(was) if was is not None else "64 (engine)" if key == "cache_margin_mb" else "-"
        rows.append([key, shown, str(value), c.why.get(key.removeprefix("storage."), "")])
    out += _grid(rows)
    out.append("")
    if r.written:
        out.append("wrote " + " and ".join(r.written))
    else:
        out.append("nothing written (--no-write)")
    return "\n".join(out)


def _grid(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
