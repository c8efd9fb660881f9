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
from typing import Any

from bmoe_edge.boards import profiles
from bmoe_edge.engine import settings
from bmoe_edge.engine.settings import BY_NAME
from bmoe_edge.tune.measure import (
    ComputeCell,
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
    toy_reasons,
)
from bmoe_edge.tune.rules import Reads, choose, choose_reads
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

BENCH_PRESET = "qwen3-30b-a3b-3g"     # the bench presets' layer shape (Qwen3-30B-A3B's expert slices)
BENCH_LAYERS = 2                     # a few layers: ~0.3 GB, written once to the cache


def bench_shaped_model(progress: Progress = quiet) -> Path | None:
    """The compute model of `tune` without -m: the bench presets' layers, BENCH_LAYERS of them, written
    once under $BMOE_EDGE_CACHE/bench/ (a lock keeps concurrent tunes from writing it twice). None where
    it cannot be written (a board: no gguf/numpy there) — then threads are not tuned without -m."""
    path = _cache_dir() / "bench" / f"tune-{BENCH_PRESET}-{BENCH_LAYERS}l-Q4_0.gguf"
    if path.is_file():
        return path
    try:
        import gguf  # noqa: F401 - the writer's dependencies (the host extra)
        import numpy  # noqa: F401

        from bmoe_edge.synthetic import bigmoe
    except ImportError:
        return None
    import fcntl

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.is_file():
                progress(f"writing the benchmark-shaped compute model {path} (once) ...")
                bigmoe.write_preset(path, BENCH_PRESET, "Q4_0", n_layer=BENCH_LAYERS)
    except OSError as exc:
        progress(f"  cannot write {path}: {exc.strerror or exc}: threads are not tuned")
        return None
    return path


def compute_configs(profile: profiles.BoardProfile, model: Path, machine: Machine, reads: Reads,
                    ) -> list[tuple[str, Any]]:
    """The runs the compute cells time: streaming the way the profile runs (its settings, the measured
    lanes and read path) with no expert cache, so every token reads its experts beside the compute
    threads; and resident when the model fits (FIT_FRACTION of the free memory)."""
    small = {"ctx": 256, "batch": 64, "ubatch": 64}
    configs = [("stream", settings.resolve(profile.engine, {
        **small, "stream": True, "cache_mb": 0.0, "io_threads": reads.io_threads, "read_path": reads.read_path}))]
    if fits_in_memory(model, machine):
        configs.append(("resident", settings.resolve(profile.engine, {**small, "stream": False})))
    return configs


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
    leave = toy_reasons(model, sizes, machine) if model is not None else {}
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
    compute_model = model if model is not None else bench_shaped_model(progress)
    compute: list[ComputeCell] = []
    if compute_model is None:
        leave["compute"] = ("no compute model here (the benchmark-shaped one needs the host extra to write): "
                            "pass -m MODEL to tune threads")
    else:
        configs = compute_configs(profile, compute_model, machine, choose_reads(io, note, plan.sizes))
        progress(f"compute ({compute_model.name}, {' and '.join(m for m, _ in configs)}):")
        compute = measure_compute(compute_model, configs, plan, progress)
    before = profile_before(profile)
    choice = choose(io, note, compute, machine, plan.sizes, profile.page_size, before=before, leave=leave)
    warnings = []
    if model is not None and leave:
        warnings.append(f"{model.name}: its figures won't carry over to real models ({'; '.join(leave.values())}); "
                        f"left alone: {', '.join(choice.left)}")
    elif "compute" in leave:
        warnings.append(f"threads left alone: {leave['compute']}")
    for line in warnings:
        progress(f"warning: {line}")
    result = TuneResult(
        board=name, where="this machine", read_file=read_file, sizes=plan.sizes, io=tuple(io), odirect_note=note,
        fixture=str(compute_model or ""), compute=tuple(compute), machine=machine, before=before, choice=choice,
        measured_at=time.strftime("%Y-%m-%d %H:%M %Z"), warnings=tuple(warnings),
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
    if r.compute:
        out.append(f"compute, decode tok/s, median (low-high) of the rounds ({Path(r.fixture).name})")
        threads = sorted({c.threads for c in r.compute})
        rows = [["threads", *(str(t) for t in threads)]]
        for mode in ("stream", "resident"):
            cells = {c.threads: c for c in r.compute if c.mode == mode}
            if cells:
                rows.append([mode, *(f"{cells[t].tok_s:.2f} ({cells[t].low:.2f}-{cells[t].high:.2f})"
                                     if t in cells else "-" for t in threads)])
        out += _grid(rows)
    else:
        out.append("compute: not measured")
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
        if value is None:
            rows.append([key, shown, "(left alone)", c.left.get(name, "")])
        else:
            rows.append([key, shown, str(value), c.why.get(name, "")])
    out += _grid(rows)
    out.append("")
    out += [f"warning: {w}" for w in r.warnings]
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
