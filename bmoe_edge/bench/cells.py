"""Benchmark cells: one configuration measured in a fresh process (under the RAM cap) that prints one
JSON record; the per-token rows go to a CSV."""

from __future__ import annotations

import csv
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bmoe_edge.bench.io import io_replay
from bmoe_edge.bench.machine import PROMPT, drop_page_cache, loadavg, long_prompt, proc_read_bytes, proc_threads
from bmoe_edge.bench.ramcap import MemCap
from bmoe_edge.errors import BmoeError
from bmoe_edge.units import MiB

if TYPE_CHECKING:
    from bmoe_edge.engine import Generation

RECORD_PREFIX = "BMOE-BENCH-RECORD "


# The read-ahead settings `auto` is measured against in one process (the `pfauto-paired-*` cells).
PREFETCH_RIVALS = ("predict", "off")
# `defaults` with one knob turned (issue 48's held-out check): what the defaults must not lose to at any storage
# class, beside the physical limit (the class's bandwidth over the fewest bytes per token any of them read).
DEFAULTS_RIVALS: dict[str, dict[str, Any]] = {
    "defaults-prefetch-off": {"prefetch": "off"},
    "defaults-cache-0": {"cache_mb": 0},
    "defaults-io-2": {"io_threads": 2},
}


@dataclass
class BenchCell:
    label: str
    kind: str  # resident | mmap | stream | io | storage-check | llama-bench
    config: dict[str, Any] = field(default_factory=dict)  # StreamConfig fields (engine cells)
    capped: bool = True
    tokens: int = 64
    warmup: int = 0  # tokens generated (same prompt) before the measured run, same engine
    io: dict[str, Any] = field(default_factory=dict)  # io cells: mode, lanes, barrier; storage-check: seconds
    group: str = ""  # for plots: resident | mmap | stream | io
    # Engine cells: a second engine (this config) in the same process, stepped token by token in turn
    # with the cell's own; the record gets the per-token time ratio against it (see _paired_cell).
    against: dict[str, Any] = field(default_factory=dict)
    prompt_tokens: int = 0  # a long-prompt cell: a prompt of this many tokens (machine.long_prompt), not PROMPT
    # Before the measured prompt, the pool's pages faulted in up to the cache's budget, as `serve` does while it
    # waits for a request (a server's next prompt, not a process's first steps); the record says how long it took.
    warm_pool: bool = False

    def spec(self, model: Path, tokens_csv: Path | None) -> dict[str, Any]:
        return {"label": self.label, "kind": self.kind, "model": str(model), "config": self.config,
                "tokens": self.tokens, "warmup": self.warmup, "io": self.io, "prompt": PROMPT,
                "prompt_tokens": self.prompt_tokens, "warm_pool": self.warm_pool,
                "against": self.against, "tokens_csv": str(tokens_csv) if tokens_csv else ""}


TOKEN_COLUMNS = ("step", "n_tokens", "wall_ms", "io_ms", "stall_ms", "drain_ms", "compute_ms", "bytes_read",
                 "slice_bytes", "copy_bytes", "cache_lookups", "cache_hits", "whole_graphs", "evictions",
                 "major_faults", "rss_bytes", "resident_expert_bytes", "storage_bytes", "net_bytes", "read_ahead",
                 "predicted", "predicted_correct", "ahead_bytes", "ahead_wasted_bytes", "guessed_bytes",
                 "guessed_wasted_bytes", "routed_bytes", "released_bytes", "cache_budget_bytes")


def _engine_cell(spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from bmoe_edge.engine import Engine, Generation, StreamConfig

    config = StreamConfig(**spec["config"])
    t0 = time.perf_counter()
    io_load0 = proc_read_bytes()
    with Engine(spec["model"], config) as engine:
        info = engine.run_info
        load_s = time.perf_counter() - t0
        load_storage = proc_read_bytes() - io_load0
        prompt = long_prompt(engine.tokenize, spec["prompt_tokens"]) if spec.get("prompt_tokens") else spec["prompt"]
        if spec["warmup"]:
            # A long prompt warms up on its reverse: the same experts faulted in, no prefix to reuse.
            engine.run(prompt[::-1] if spec.get("prompt_tokens") else prompt, spec["warmup"])
        warm_s = _warm_pool(engine) if spec.get("warm_pool") else 0.0
        rows: list[dict[str, Any]] = []
        gen = Generation([])
        prev = proc_read_bytes()
        for token in engine.generate(prompt, spec["tokens"], result=gen):
            now = proc_read_bytes()
            rows.append(asdict(token.metrics) | {"storage_bytes": now - prev})
            prev = now
        threads = proc_threads()
    return (_generation_record(gen, threads, load_s, info) | {"load_storage_bytes": load_storage, "warm_s": warm_s}
            | _prefill_record(gen, rows)), rows


def _warm_pool(engine: Any) -> float:
    """Seconds to fault the pool's pages in up to the cache's budget (serve's idle steps, back to back)."""
    t0 = time.perf_counter()
    while engine.warm_cache_memory():
        pass
    return round(time.perf_counter() - t0, 3)


def _prefill_record(gen: Generation, rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The prompt's step: tokens, time, the time to the first token, bytes read against the distinct experts
    routed (one read of each), the compute-buffer memory given back after it and the budget then."""
    from bmoe_edge.engine import report  # the engine's modules load the native module: in the cell's process only

    out: dict[str, Any] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in report.prefill(gen).items()}
    out["prompt_tokens"] = len(gen.prompt_tokens)
    out["prefill_storage_bytes"] = rows[0].get("storage_bytes", 0) if rows else 0
    out["budget_after_prompt_mb"] = round(rows[0].get("cache_budget_bytes", 0) / MiB, 1) if rows else 0.0
    return out


def _generation_record(gen: Generation, threads: int, load_s: float, info: dict[str, Any]) -> dict[str, Any]:
    """What every engine cell's record says of its measured generation and its engine."""
    return {
        "stop_reason": gen.stop_reason, "generated": len(gen.tokens), "distinct_tokens": len(set(gen.tokens)),
        "process_threads": threads, "load_s": round(load_s, 3),
        "run": {k: v for k, v in info.items() if k != "model"},
    }


def _paired_cell(spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Two engines on the same file in one process, stepped in turn (ABBA) token by token: this cell's
    configuration and `against` (e.g. the model resident). On a shared machine whose speed drifts by
    ±20% between processes, a 3% difference only shows as per-token ratios taken side by side. The rows
    are this cell's engine's; the tokens of both must agree."""
    from bmoe_edge.engine import Engine, Generation, StreamConfig

    t0 = time.perf_counter()
    with Engine(spec["model"], StreamConfig(**spec["against"])) as base, \
            Engine(spec["model"], StreamConfig(**spec["config"])) as engine:
        info = engine.run_info
        load_s = time.perf_counter() - t0
        if spec["warmup"]:
            base.run(spec["prompt"], spec["warmup"])
            engine.run(spec["prompt"], spec["warmup"])
        results = (Generation([]), Generation([]))
        steps = (engine.generate(spec["prompt"], spec["tokens"], result=results[0]),
                 base.generate(spec["prompt"], spec["tokens"], result=results[1]))
        rows: list[dict[str, Any]] = []
        base_ms: list[float] = []
        for i in range(spec["tokens"]):
            taken: dict[int, Any] = {}
            for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                taken[k] = next(steps[k], None)
            if taken[0] is None or taken[1] is None:
                break
            # /proc/self/io counts both engines' reads: a full cache's own are in its metrics (bytes_read).
            rows.append(asdict(taken[0].metrics) | {"storage_bytes": 0})
            base_ms.append(taken[1].metrics.wall_ms)
        for step in steps:
            step.close()
        threads = proc_threads()
    pairs = [(b, r["wall_ms"]) for r, b in zip(rows, base_ms, strict=True) if r.get("step", 0) > 0 and r["wall_ms"] > 0]
    if not pairs:
        raise BmoeError("the paired cell decoded no token: nothing to compare")
    return _generation_record(results[0], threads, load_s, info) | {
        "paired_ratio": round(statistics.median(b / a for b, a in pairs), 4),
        "paired_mean_ratio": round(sum(b for b, _ in pairs) / sum(a for _, a in pairs), 4),
        "paired_same_tokens": results[0].tokens == results[1].tokens,
    }, rows


def _llama_bench_cell(spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pin's own llama-bench with llama.cpp's defaults (resident, repacked kernels): decode of the cell's
    tokens and, for a long-prompt cell, its prompt (bench/llama_bench.py)."""
    from bmoe_edge.bench import llama_bench

    got = llama_bench.run(Path(spec["model"]), threads=int(spec["config"].get("threads", 1)),
                          decode_tokens=spec["tokens"], prompt_tokens=spec.get("prompt_tokens") or 0,
                          wrapper=spec.get("wrapper", ()))
    out: dict[str, Any] = {"decode_tokens": spec["tokens"], "tok_s": round(got.get("decode_tok_s", 0.0), 4)}
    if "prompt_tok_s" in got:
        out |= {"prompt_tokens": spec["prompt_tokens"], "prompt_tok_s": round(got["prompt_tok_s"], 3)}
    return out, []


def _io_cell(spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    io = spec["io"]
    rows = io_replay(Path(spec["model"]), tokens=spec["tokens"] + 1, lanes=int(io.get("lanes", 4)),
                     mode=io.get("mode", "odirect"), seed=int(io.get("seed", 0)), barrier=bool(io.get("barrier", True)))
    for r in rows:
        r.update({"io_ms": r["wall_ms"], "compute_ms": 0.0, "rss_bytes": 0})
    return {"process_threads": proc_threads(), "run": {"io_threads": io.get("lanes", 4),
                                                       "read_path": io.get("mode", "odirect")}}, rows


def _storage_check_cell(spec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What the drive delivers to this process (inside the cell's throttle, if any): O_DIRECT, buffered
    and mmap MB/s and 4 KiB IOPS (bench.storage.storage_check)."""
    from bmoe_edge.bench.storage import check_seconds, storage_check

    io = spec["io"]
    return storage_check(Path(spec["model"]), check_seconds(float(io.get("seconds", 3.0)), io.get("class_mb_s"))), []


def measure_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one cell in this process; returns its record (per-token rows go to tokens_csv)."""
    la0 = loadavg()
    t0 = time.perf_counter()
    record: dict[str, Any] = {"label": spec["label"], "kind": spec["kind"], "loadavg_before": la0}
    if spec["kind"] == "io":
        extra, rows = _io_cell(spec)
    elif spec["kind"] == "storage-check":
        extra, rows = _storage_check_cell(spec)
    elif spec["kind"] == "llama-bench":
        extra, rows = _llama_bench_cell(spec)
    elif spec.get("against"):
        extra, rows = _paired_cell(spec)
    else:
        extra, rows = _engine_cell(spec)
    record.update(summarise_tokens(rows))
    record.update(extra)  # a cell without per-token rows (llama-bench) says its own decode figures
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
        # Read-ahead: how often the guess was right, and what wrong guesses cost in bytes.
        "read_ahead_pct": round(100 * total("read_ahead") / n, 1),
        "predicted_right_pct": round(100 * total("predicted_correct") / total("predicted"), 2)
        if total("predicted") else 0.0,
        "ahead_wasted_bytes_per_token": round(total("ahead_wasted_bytes") / n),
        "net_bytes_per_token": round(total("net_bytes") / n),
    }


def cell_main(spec_json: str) -> int:
    spec = json.loads(spec_json)
    try:
        record = measure_cell(spec)
        record["status"] = "ok"
    except BmoeError as exc:
        record = {"label": spec.get("label", ""), "kind": spec.get("kind", ""), "status": "error", "error": str(exc)}
    print(RECORD_PREFIX + json.dumps(record), flush=True)
    return 0 if record["status"] == "ok" else 1


def python_through(wrapper: Sequence[str]) -> list[str]:
    """This Python, started as this machine starts its own programs (an emulated board's exec wrapper first)."""
    return [*wrapper, sys.executable]


def cell_command(spec: dict[str, Any], python: Sequence[str] = ()) -> list[str]:
    """The command that runs one cell's `spec` in a Python of its own, started as `python` says (an emulated
    board's exec wrapper first; () = sys.executable)."""
    return [*(python or [sys.executable]), "-m", "bmoe_edge", "bench", "cell", json.dumps(spec)]


def spawn_cell(cell: BenchCell, model: Path, cap: MemCap, tokens_csv: Path | None, timeout: float,
               env: dict[str, str] | None = None, wrapper: Sequence[str] = ()) -> dict[str, Any]:
    """Run a cell in a fresh process (inside the cap), cold: the model's pages dropped first. `wrapper`: how
    this machine starts its own programs (an emulated board's exec wrapper): the cell's Python, its llama-bench."""
    drop_page_cache(model)
    cap.prepare()
    cmd = cell_command(cell.spec(model, tokens_csv) | {"wrapper": list(wrapper)}, python_through(wrapper))
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
        "throttle": capped.throttle, "throttled_read_bytes": capped.throttled_read_bytes,
    })
    return record
