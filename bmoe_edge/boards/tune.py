"""`bmoe-edge tune` on the machine it runs on: measure (`bench/tune.py`), choose, write a user profile.

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

It writes `<board>.yaml` (`extends: <board>`, the engine settings under `engine:`, the read speed under
`storage:`, the measurements as comments) into the user profile directory (`profiles.user_dir()`), or
`--out FILE`, atomically and only at the end, after the profile resolved. A board over SSH is
`fleet/tune.py`: the deployed release runs this with `--json --no-write` and the profile it returns is
written with `write_profile` both here and there.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from bmoe_edge.bench.tune import (
    ComputeCell,
    IoCell,
    Machine,
    Progress,
    check_readable,
    fits_in_memory,
    machine_facts,
    make_plan,
    measure_compute,
    measure_io,
    model_slice_sizes,
    quiet,
    scratch_file,
)
from bmoe_edge.boards import profiles
from bmoe_edge.engine.memlimits import MemoryLimit
from bmoe_edge.engine.settings import BY_NAME
from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic.specs import FixtureSpec, host_fixture_paths
from bmoe_edge.units import KiB, MiB, size_text

LANE_TOLERANCE = 0.95       # the fewest lanes within 5% of the best bandwidth
PREAD_ADVANTAGE = 1.10      # pread is chosen only when it is more than 10% faster than O_DIRECT
MARGIN_BASE_MB = 64
MARGIN_LIMIT_FRACTION = 0.01
ENGINE_KEYS = ("io_threads", "threads", "read_path", "cache_margin_mb")   # what tune sets under `engine:`


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


def _before(profile: profiles.BoardProfile) -> dict[str, Any]:
    """The profile's own values of what tune sets (None: the profile leaves it to the engine's default)."""
    return {**{key: profile.engine.get(key) for key in ENGINE_KEYS},
            "read_mb_s": profile.storage.read_mb_s, "page_size": profile.page_size}


def profile_fields(board: str, choice: Choice) -> dict[str, Any]:
    """The user profile's fields: it extends the board's, engine settings under `engine:`."""
    data: dict[str, Any] = {"extends": board}
    if choice.page_size is not None:
        data["page_size"] = choice.page_size
    data["storage"] = {"read_mb_s": choice.read_mb_s}
    data["engine"] = {key: getattr(choice, key) for key in ENGINE_KEYS}
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
        f"# reads of {', '.join(size_text(s) for s in r.sizes)} from {r.read_file}, MiB/s by lanes:",
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
def staged(dest: Path, text: str) -> Iterator[Path]:
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


def release_dir() -> Path | None:
    """The deployed release this code runs from ($BMOE_EDGE_RELEASE, or <release>/site/bmoe_edge/)."""
    env = os.environ.get("BMOE_EDGE_RELEASE")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[3])
    for rel in candidates:
        if (rel / "manifest.json").is_file() and (rel / "site").is_dir():
            return rel
    return None


def compute_fixture() -> Path:
    """The tiny fixture the compute cells run: a bundle's (on a board), else generated here (cached)."""
    spec = FixtureSpec("qwen3moe", "Q8_0")
    dirs = [os.environ.get("BMOE_EDGE_FIXTURES", "")]
    rel = release_dir()
    if rel is not None:
        dirs.append(str(rel / "fixtures"))
    for d in dirs:
        if d and (Path(d) / spec.filenames[0]).is_file():
            return Path(d) / spec.filenames[0]
    try:
        return host_fixture_paths(spec)[0]
    except ImportError as exc:
        raise BmoeError(f"no compute fixture here ({spec.filenames[0]} is in a board bundle's fixtures/; "
                        f"generating it needs the host extra: {exc.name} is missing)") from None


def write_profile(dest: Path, text: str) -> None:
    with staged(dest, text) as tmp:
        commit(tmp, dest)


def tune_local(board: str | None = None, *, model: Path | None = None, out: Path | None = None,
               quick: bool = False, scratch_dir: Path | None = None, write: bool = True,
               progress: Progress = quiet) -> TuneResult:
    """Measure this machine, choose, write the profile (unless `write` is false); the inputs are checked
    before anything is measured, and the file is written only at the end."""
    name = board or profiles.machine_board()
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
            read_file = f"a {size_text(plan.scratch_bytes)} scratch file in {where}"
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
    write_profile(dest, text)
    return replace(result, written=(str(dest),))


def _cache_dir() -> Path:
    return Path(os.environ.get("BMOE_EDGE_CACHE") or Path.home() / ".cache" / "bmoe-edge")


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
                rows.append([mode, size_text(size), *(f"{cells[n]:.0f}" if n in cells else "-" for n in lanes)])
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
    chosen = [("engine.read_path", c.read_path), ("engine.io_threads", c.io_threads),
              ("storage.read_mb_s", c.read_mb_s), ("engine.threads", c.threads),
              ("engine.cache_margin_mb", c.cache_margin_mb)]
    if c.page_size is not None:
        chosen.append(("page_size", c.page_size))
    rows = [["field", "was", "now", "why"]]
    for key, value in chosen:
        name = key.rpartition(".")[2]
        was = r.before.get(name)
        shown = str(was) if was is not None else f"{BY_NAME[name].default} (engine)" if name in BY_NAME else "-"
        rows.append([key, shown, str(value), c.why.get(name, "")])
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
