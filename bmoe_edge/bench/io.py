"""`bench io`: the drive's random-read bandwidth through the engine's own reader, and the engine's read
pattern replayed without compute (per token and layer, the routed experts' slices, a barrier per layer).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bmoe_edge.bench.layout import gguf_layout
from bmoe_edge.bench.machine import (
    align_up,
    drop_page_cache,
    loadavg,
    machine_info,
    proc_read_bytes,
    write_rows,
)
from bmoe_edge.engine import native
from bmoe_edge.errors import BmoeError
from bmoe_edge.units import MiB, size_text


def reader(path: Path, lanes: int, mode: str) -> Any:
    """The engine's own reader (bindings: `parts.Reader`): its read lanes, O_DIRECT windows into a
    page-pool mirror or pread, admission and eviction as the streamer does them."""
    n = native.load()
    if mode not in ("odirect", "pread"):
        raise BmoeError(f"read mode must be odirect or pread, got {mode!r}")
    with native.engine_errors():
        return n.parts.Reader(str(path), lanes, mode)


def _read(r: Any, ranges: list[tuple[int, int]]) -> dict[str, Any]:
    with native.engine_errors():
        return r.read(ranges)


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
            r = reader(path, n_lanes, mode)
            io0 = proc_read_bytes()
            t0 = time.perf_counter()
            done = 0
            lat: list[float] = []
            step = max(n_lanes * 4, 16)
            while done < limit and time.perf_counter() - t0 < seconds:
                ranges = [(slots[i], size) for i in range(done, min(limit, done + step))]
                lat.extend(_read(r, ranges)["read_ms"])
                done += len(ranges)
            elapsed = time.perf_counter() - t0
            storage = proc_read_bytes() - io0
            nbytes = done * size
            row = {
                "mode": mode, "used": r.read_path, "size": size, "lanes": n_lanes, "repeat": rep, "reads": len(lat),
                "bytes": nbytes, "seconds": round(elapsed, 4),
                "mib_s": round(nbytes / MiB / elapsed, 2) if elapsed else 0.0,
                "storage_bytes": storage, "lat_p50_ms": round(_pct(lat, 0.5), 3),
                "lat_p99_ms": round(_pct(lat, 0.99), 3), "loadavg": loadavg(),
            }
            del r
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
    rows = []
    if mode == "pread":
        drop_page_cache(path)
    r = reader(path, lanes, mode)
    for step in range(tokens):
        token_jobs: list[tuple[int, int]] = []
        io0 = proc_read_bytes()
        t0 = time.perf_counter()
        nbytes = 0
        for il, tensors in layers.items():
            if trace is not None:
                experts = sorted(set(trace[step % len(trace)][il]))
            else:
                experts = sorted(rng.sample(range(tensors[0].n_expert), k))
            jobs = [(t.offset + e * t.slice_bytes, t.slice_bytes) for t in tensors for e in experts]
            nbytes += sum(length for _, length in jobs)
            if barrier:
                _read(r, jobs)
            else:
                token_jobs.extend(jobs)
        if token_jobs:
            _read(r, token_jobs)
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
    slice_sizes = sorted({t.slice_bytes for t in layout.experts}) if layout else []
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
            yield from sorted({t.slice_bytes for t in gguf_layout(model).experts})
        elif part.endswith("k"):
            yield int(float(part[:-1]) * 1024)
        elif part.endswith("m"):
            yield int(float(part[:-1]) * MiB)
        elif part:
            yield int(part)

