"""`bench stream` (host side): the standard cell matrix, run interleaved and repeated, each cell in a
fresh process under the cap; raw CSVs and run.json."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import random
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bmoe_edge.bench.cells import DEFAULTS_RIVALS, PREFETCH_RIVALS, TOKEN_COLUMNS, BenchCell, python_through, spawn_cell
from bmoe_edge.bench.io import io_sweep
from bmoe_edge.bench.layout import GgufLayout, gguf_layout
from bmoe_edge.bench.machine import ctx_for, machine_info, write_rows
from bmoe_edge.bench.ramcap import make_cap, read_throttle_parent
from bmoe_edge.bench.routing import routing_report
from bmoe_edge.bench.storage import NATIVE, StorageTarget, check_verdict, read_limit
from bmoe_edge.errors import BmoeError
from bmoe_edge.units import MiB


def default_cells(layout: GgufLayout, cap_bytes: int, *, tokens: int, mmap_tokens: int, threads: int,
                  budgets_mb: Sequence[float] | None = None,
                  defaults: Mapping[str, Any] | None = None,
                  long_prompts: Mapping[int, Mapping[str, Any]] | None = None) -> list[BenchCell]:
    """The standard matrix: resident warm; mmap under the cap; streamed under the same cap (cache off,
    fixed budgets, auto; 1 vs 4 lanes; pread vs O_DIRECT; overlap on/off); full-cache streamed (P1);
    the engine's read pattern without compute (io-only); `long_prompts` (prompt tokens -> what `generate`
    with no knobs does for such a prompt): the long-prompt cells, TTFT, prefill bytes and decode after it."""
    expert_mb = layout.all_expert_bytes / MiB
    ctx = ctx_for(max(tokens, mmap_tokens))
    base = {"threads": threads, "ctx": ctx, "batch": 64, "ubatch": 64}
    dense_mb = (layout.file_bytes - layout.all_expert_bytes) / MiB
    if budgets_mb is None:
        # What the cap leaves for the cache: the cap minus the dense weights (mapped, charged to the
        # cell), one layer in flight and ~240 MiB for the process (interpreter, libraries, KV, compute).
        room = cap_bytes / MiB - dense_mb - 240 if cap_bytes else expert_mb
        budgets_mb = sorted({max(0.0, round(x)) for x in (room / 4, room / 2, room)} - {0.0})
    cells = [
        BenchCell("resident", "resident", {**base, "stream": False}, capped=False, tokens=tokens, warmup=tokens,
             group="resident"),
        BenchCell("mmap", "mmap", {**base, "stream": False}, tokens=mmap_tokens, group="mmap"),
        # Stock llama.cpp as its users run it (the pin's llama-bench: resident, repacked kernels): the anchor.
        BenchCell("llama-bench", "llama-bench", {"threads": threads}, capped=False, tokens=tokens, group="resident"),
    ]

    def stream(label: str, **kw: Any) -> BenchCell:
        capped = kw.pop("capped", True)
        warm = kw.pop("warmup", 0)
        against = kw.pop("against", {})
        # Read-ahead pinned off unless a cell asks: each mechanism measured alone, as before it existed.
        return BenchCell(label, "stream", {**base, "stream": True, "io_threads": 4, "read_path": "odirect",
                                      "overlap": False, "prefetch": "off", "cache_mb": 0, **kw},
                    capped=capped, tokens=tokens, warmup=warm, group="stream", against=against)

    if defaults is not None:
        # What `generate -m M -p P` does with no knobs: every setting from the machine's profile.
        cells.append(BenchCell("defaults", "stream", dict(defaults), tokens=tokens, group="stream"))
        # The same without llama.cpp's repacked kernels: what `defaults` must never lose to (docs/streaming.md).
        cells.append(BenchCell("defaults-repack-off", "stream", {**defaults, "repack": "off"}, tokens=tokens,
                               group="stream"))
        cells += [BenchCell(label, "stream", {**defaults, **knob}, tokens=tokens, group="stream")
                  for label, knob in DEFAULTS_RIVALS.items()]
    for n, config in (long_prompts or {}).items():
        cells.append(BenchCell(f"long-prompt-{n}", "stream", dict(config), tokens=tokens, group="stream",
                               prompt_tokens=n, warm_pool=True))
        cells.append(BenchCell(f"long-prompt-{n}-repack-off", "stream", {**config, "repack": "off"}, tokens=tokens,
                               group="stream", prompt_tokens=n, warm_pool=True))
        # The same prompt resident (uncapped): the compute side of time to first token's bound.
        cells.append(BenchCell(f"long-prompt-{n}-resident", "resident", {**config, "stream": False}, capped=False,
                               tokens=2, warmup=1, group="resident", prompt_tokens=n))
        cells.append(BenchCell(f"long-prompt-{n}-llama-bench", "llama-bench", {"threads": threads}, capped=False,
                               tokens=0, group="resident", prompt_tokens=n))
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
    # Read-ahead of the predicted next layer's experts, beside the same cell without it.
    mid_mb = budgets_mb[len(budgets_mb) // 2]
    cells += [
        stream("off-overlap-od4-predict", overlap=True, prefetch="predict"),
        stream("off-overlap-od4-pfauto", overlap=True, prefetch="auto"),
        stream("off-serial-od4-predict", prefetch="predict"),
        stream(f"cache{mid_mb:g}-overlap-od4-predict", cache_mb=mid_mb, overlap=True, prefetch="predict"),
    ]
    cells.append(stream("auto-overlap-od4", cache_mb="auto", overlap=True))
    # Read-ahead `auto` beside `predict` and beside no read-ahead, token by token in one process (two cells
    # minutes apart on a shared drive differ by more than the policies do). Two fixed caches that fit the
    # cap together (each engine's `auto` would size itself to the whole cgroup), serial (the overlap hook is
    # one per process; read-ahead is the same mechanism in both modes).
    low_mb = budgets_mb[0]
    for rival in PREFETCH_RIVALS:
        cells.append(stream(f"pfauto-paired-{rival}", cache_mb=low_mb, prefetch="auto",
                            against={**base, "stream": True, "io_threads": 4, "read_path": "odirect", "overlap": False,
                                     "cache_mb": low_mb, "prefetch": rival}))
    # The adaptive cache's point, one knob at a time (lanes, overlap, read-ahead): what `defaults` must
    # not lose to at a slow drive (the storage campaign, docs/benchmarks.md).
    # 3 lanes: what `tune` picks at the Pi 5's Gen 2 and microSD classes, judged against the others.
    cells += [
        stream("auto-overlap-od3", cache_mb="auto", overlap=True, io_threads=3),
        stream("auto-overlap-od2", cache_mb="auto", overlap=True, io_threads=2),
        stream("auto-overlap-od1", cache_mb="auto", overlap=True, io_threads=1),
        stream("auto-serial-od4", cache_mb="auto"),
        stream("auto-overlap-od4-predict", cache_mb="auto", overlap=True, prefetch="predict"),
        stream("auto-overlap-od4-pfauto", cache_mb="auto", overlap=True, prefetch="auto"),
    ]
    if cap_bytes:
        cells.append(stream("auto-ceil-overlap-od4", cache_mb="auto", cache_ceil_mb=int(max(budgets_mb)),
                            overlap=True))
    full = math.ceil(expert_mb * 1.02 + 1)
    cells += [
        stream("fullcache-serial", cache_mb=full, capped=False, warmup=tokens),
        stream("fullcache-overlap", cache_mb=full, overlap=True, capped=False, warmup=tokens),
        # P1's measure: the same full cache beside the resident model, token by token in one process.
        stream("fullcache-paired", cache_mb=full, overlap=True, capped=False, warmup=tokens,
               against={**base, "stream": False}),
    ]
    io_tokens = min(tokens, 32)  # steady state is reached at once: no cache, no compute
    cells += [
        BenchCell("io-od4", "io", io={"mode": "odirect", "lanes": 4, "barrier": True}, tokens=io_tokens, group="io"),
        BenchCell("io-od1", "io", io={"mode": "odirect", "lanes": 1, "barrier": True}, tokens=io_tokens, group="io"),
        BenchCell("io-od4-nobarrier", "io", io={"mode": "odirect", "lanes": 4, "barrier": False}, tokens=io_tokens,
             group="io"),
        BenchCell("io-pr4", "io", io={"mode": "pread", "lanes": 4, "barrier": True}, tokens=io_tokens, group="io"),
        # What the drive (throttled to --storage's class, or as it is) delivers to a cell's process.
        BenchCell("storage-check", "storage-check", capped=False, io={"seconds": 3.0}, group="io"),
    ]
    return cells


CELL_COLUMNS = (
    "model", "label", "kind", "repeat", "status", "tok_s", "ms_per_token", "ms_per_token_median", "decode_tokens",
    "bytes_read_per_token", "storage_bytes_per_token", "copy_bytes_per_token", "cache_hit_pct", "io_ms_per_token",
    "stall_ms_per_token", "drain_ms_per_token", "compute_ms_per_token", "read_mib_s", "major_faults_per_token",
    "evictions_per_token", "read_ahead_pct", "predicted_right_pct", "ahead_wasted_bytes_per_token",
    "peak_rss_bytes", "cap_method", "cap_mb", "cap_max_usage_mb", "cap_failcnt",
    "cap_oom_kills", "threads", "io_threads", "read_path", "overlap", "prefetch", "cache_mode", "cache_budget_mb",
    "process_threads", "loadavg_before", "loadavg_after", "load_s", "load_storage_bytes", "warm_s", "distinct_tokens",
    "stop_reason", "cell_s", "wall_s", "paired_ratio", "paired_mean_ratio", "paired_same_tokens",
    # the prompt's step (every engine cell; what the long-prompt cells are for)
    "prompt_tokens", "prompt_decoded_tokens", "prompt_ms", "prompt_tok_s", "ttft_ms", "prefill_bytes",
    "prefill_routed_bytes", "prefill_released_bytes", "budget_after_prompt_mb", "ubatch",
    "storage", "throttle", "throttled_read_bytes", "odirect_mb_s", "buffered_mb_s", "mmap_mb_s", "iops_4k",
    "odirect_ratio", "buffered_ratio", "mmap_ratio", "iops_ratio", "warning", "error",
)


def _flatten(record: dict[str, Any], model: str, repeat: int) -> dict[str, Any]:
    run = record.get("run", {})
    out = {"model": model, "repeat": repeat, **{k: v for k, v in record.items() if k != "run"}}
    for key in ("threads", "io_threads", "read_path", "overlap", "prefetch", "cache_mode", "cache_budget_mb",
                "ubatch", "warning"):
        if key in run:
            out[key] = run[key]
    return out


@dataclass
class Campaign:
    model: Path
    out: Path
    cap_bytes: int
    cap_method: str
    cells: list[BenchCell]
    repeats: int
    io_sizes: Sequence[int] = ()
    io_seconds: float = 2.0
    routing_tokens: int = 0
    seed: int = 0
    log: Any = None
    storage: StorageTarget | None = None  # every cell's reads throttled to it (None: the drive as it is)
    wrapper: Sequence[str] = ()  # how this machine starts its own programs (an emulated board's exec wrapper)

    @property
    def python(self) -> list[str]:
        """How a cell's Python starts: through the wrapper."""
        return python_through(self.wrapper)


def stream_campaign(c: Campaign) -> dict[str, Any]:
    """Run every cell `repeats` times, interleaved (a shuffled order per repeat), each in a fresh
    process under the cap; with an io sweep at the start of each repeat. Writes the raw data."""
    # The throttle is checked before anything runs: a tmpfs model or a missing controller is one line.
    limit = read_limit(c.storage, c.model) if c.storage is not None else None
    if limit is not None:
        read_throttle_parent()
        for cell in c.cells:  # the check reads for longer at a slow class (bench.storage.check_seconds)
            if cell.kind == "storage-check":
                cell.io["class_mb_s"] = c.storage.read_mb_s  # type: ignore[union-attr]
    c.out.mkdir(parents=True, exist_ok=True)
    raw = c.out / "tokens"
    raw.mkdir(exist_ok=True)
    layout = gguf_layout(c.model)
    say = c.log or (lambda s: print(s, file=sys.stderr, flush=True))
    meta = {
        "model": str(c.model), "file_bytes": layout.file_bytes, "expert_bytes": layout.all_expert_bytes,
        "routed_bytes_per_token": layout.routed_bytes_per_token, "n_expert": layout.n_expert,
        "n_expert_used": layout.n_expert_used, "n_layer": len(layout.layers()),
        "slice_bytes": sorted({t.slice_bytes for t in layout.experts}),
        "model_metadata": {k: v for k, v in layout.metadata.items()
                           if k.startswith(("bmoe.", "general.name", "general.architecture", "general.file_type"))},
        "cap_bytes": c.cap_bytes, "cap_request_method": c.cap_method, "repeats": c.repeats,
        "storage": asdict(c.storage) if c.storage else None,
        "read_limit": asdict(limit) if limit else None,
        "cells": [asdict(cell) for cell in c.cells], "machine": machine_info(c.model),
        "argv": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (c.out / "run.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    if c.routing_tokens:
        say(f"routing trace ({c.routing_tokens} tokens)")
        stats = routing_report(c.model, c.routing_tokens, c.out, python=c.python)
        say(f"  reuse {stats['prev_token_reuse']:.3f} (chance {stats['chance_reuse']}), zipf median "
            f"{stats['zipf_per_layer_median']}")
    cells_csv = c.out / "cells.csv"
    io_csv = c.out / "io.csv"
    records = []
    io_rows: list[dict[str, Any]] = []
    slice_sizes = sorted({t.slice_bytes for t in layout.experts})
    io_sizes = list(c.io_sizes) or [4096, 65536, *slice_sizes, 4 * MiB]
    with open(cells_csv, "w", newline="") as fc:
        writer = csv.DictWriter(fc, fieldnames=CELL_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for rep in range(c.repeats):
            if c.io_seconds > 0 and limit is None:  # the sweep runs here, outside any cell's throttle
                try:
                    rows = io_sweep(c.model, sizes=io_sizes, lanes=(1, 4), seconds=c.io_seconds, seed=c.seed + rep,
                                    modes=("odirect", "pread"))
                except BmoeError as exc:  # a drive reading: the cells' measurements do not depend on it
                    say(f"[{rep}] io sweep failed: {exc}")
                    rows = []
                for r in rows:
                    r["repeat"] = rep
                io_rows.extend(rows)
                write_rows(io_csv, io_rows)
                say(f"[{rep}] io sweep: " + ", ".join(f"{r['mode']} {r['size'] // 1024}K x{r['lanes']} "
                                                      f"{r['mib_s']:.0f}" for r in rows if r["size"] in slice_sizes))
            order = list(c.cells)
            random.Random(c.seed * 7919 + rep).shuffle(order)
            for cell in order:
                cap = make_cap(c.cap_bytes if cell.capped else 0, c.cap_method, limit, python=c.python)
                timeout = 120 + cell.warmup * 2 + cell.tokens * (30 if cell.kind == "mmap" else 8) + cell.prompt_tokens
                tokens_csv = raw / f"{cell.label}-r{rep}.csv"
                record = spawn_cell(cell, c.model, cap, tokens_csv, timeout, wrapper=c.wrapper)
                flat = _flatten(record, c.model.name, rep)
                flat["storage"] = c.storage.name if c.storage else NATIVE
                flat.update(check_verdict(flat, c.storage) if cell.kind == "storage-check" else {})
                records.append(flat)
                writer.writerow(flat)
                fc.flush()
                if cell.kind == "storage-check":
                    what = (f"O_DIRECT {flat.get('odirect_mb_s', 0)} buffered {flat.get('buffered_mb_s', 0)} mmap "
                            f"{flat.get('mmap_mb_s', 0)} MB/s, {flat.get('iops_4k', 0)} IOPS at 4 KiB")
                else:
                    what = (f"{float(record.get('tok_s', 0)):8.3f} tok/s "
                            f"hit {float(record.get('cache_hit_pct', 0)):5.1f}% "
                            f"read {float(record.get('bytes_read_per_token', 0)) / MiB:7.1f} MiB/tok")
                say(f"[{rep}] {cell.label:<26} {record.get('status'):<10} {what} la {record.get('loadavg_before', '-')}"
                    + (f"  {record.get('error', '')}" if record.get("status") != "ok" else ""))
    _merge_tokens(raw, c.out / "tokens.csv")
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (c.out / "run.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return meta


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
