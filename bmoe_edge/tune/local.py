"""`bmoe-edge tune` on the machine it runs on: measure (measure.py), choose (rules.py), write the user
profile (user_profile.py), and the table it prints. A board over SSH is over_ssh.py: the deployed
release runs this with `--json --no-write` and the profile it returns is written both here and there.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from bmoe_edge.boards import profiles
from bmoe_edge.engine.settings import BY_NAME
from bmoe_edge.errors import BmoeError
from bmoe_edge.synthetic.specs import FixtureSpec, host_fixture_paths
from bmoe_edge.tune.measure import (
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
from bmoe_edge.tune.rules import choose
from bmoe_edge.tune.user_profile import (
    TuneResult,
    check_profile,
    check_writable,
    destination,
    profile_before,
    render_profile,
    write_profile,
)
from bmoe_edge.units import KiB, size_text


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
        fixture=str(fixture), compute=tuple(compute), machine=machine, before=profile_before(profile), choice=choice,
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
