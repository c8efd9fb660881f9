"""--speculative off / mtp / auto at a storage class, under a RAM cap (bench-data/2026-12-02/mtp).

Fixtures (bmoe_edge.synthetic.mtp_rows, written once into ~/.cache/bmoe-edge/bench-mtp): an ARCH trunk
of 24 layers (the first dense), n_embd 512, experts 1024 wide, 32 experts, top-2 (a token routes to
1/16 of a layer, as Qwen3's 8 of 128), Q8_0, ~1.4 GB, with its MTP heads (glm4moe: one; step35:
three, chained; gemma4: a separate assistant model over its KV cache, resident, given as --draft-model
to the mtp and auto cells) in HEADS variants: agree (the upper side: the head predicts what the model
will), random (the lower side: every draft rejected).

Every cell is a fresh process inside a cgroup: memory capped at CAP of the model file (the cache
sizes itself from it: cache auto), every read of the model's block device throttled to the storage
class (`ramcap.throttle_reads`, the cgroup blkio controller, as `bench stream --storage` does), the
model's page cache dropped first (cold). Engine: the defaults (overlap, read-ahead auto, lanes and
threads auto, cache auto) but `speculative`, and CTX/BATCH. In each repeat the cells of one head
run back to back (off, mtp, auto, in an order rotated per repeat), so a ratio is taken within a
repeat. Writes cells-ARCH-STORAGE.csv (one row per cell) and prints a summary table.

    .venv/bin/python bench-data/2026-12-02/mtp/run.py [--out DIR] [--arch glm4moe|step35|gemma4]
        [--storage rpi5-nvme-gen2|native|MB/s] [--cap 40%] [--repeats 3] [--tokens 192]
        [--heads agree,random] [--trace DIR (per-step rows of every cell)]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RECORD = "MTP-CELL "
SPECS = ("off", "mtp", "auto")
HEADS = ("agree", "random")
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
# A 13-token prompt and 192 tokens: a 1024 context and 64-token batches (the default 512-token batch's
# compute buffers, twice with the head's context, would take most of the 40% cap of a small model).
CTX, BATCH = 1024, 64


def fixture(arch: str, head: str) -> Path:
    """The model (gemma4: its assistant beside it, `draft_model.draft_model_of`, written first)."""
    from bmoe_edge.synthetic import assistant_rows, mtp_rows
    from bmoe_edge.synthetic.draft_model import draft_model_of

    cache = Path.home() / ".cache/bmoe-edge/bench-mtp"
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"mtp-{arch}-{head}-l24-e512-f1024-x32.gguf"
    if not path.is_file():
        tmp = path.with_suffix(".tmp.gguf")
        dims = {"n_layer": 24, "n_embd": 512, "n_ff_exp": 1024, "n_expert": 32}
        if arch in assistant_rows.assistant_archs():
            _, assistant = assistant_rows.write_target_and_assistant(tmp, arch, "Q8_0", head=head, **dims)
            assistant.rename(draft_model_of(path))
        else:
            mtp_rows.write_mtp_moe(tmp, arch, "Q8_0", head=head, **dims)
        tmp.rename(path)
    return path


def draft_model(model: Path, speculative: str) -> str:
    """The separate draft model a cell speculates with (gemma4's assistant), "" for none."""
    from bmoe_edge.synthetic.draft_model import draft_model_of

    path = draft_model_of(model)
    return str(path) if speculative != "off" and path.is_file() else ""


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One cell, in this (capped, throttled) process."""
    from bmoe_edge.engine import Engine, StreamConfig

    t0 = time.perf_counter()
    config = StreamConfig(speculative=spec["speculative"], draft_model=draft_model(Path(spec["model"]),
                          spec["speculative"]), ctx=CTX, batch=BATCH, ubatch=BATCH)
    with Engine(spec["model"], config) as engine:
        info = dict(engine.run_info)
        load_s = time.perf_counter() - t0
        gen = engine.run(PROMPT, spec["tokens"])
    if spec.get("trace"):  # per step: what it decoded, drafted or probed, read, and the budget after it
        with open(spec["trace"], "w", encoding="utf-8") as out:
            out.write("step,n_tokens,drafted,accepted,probed,mib_read,cache_hits,cache_lookups,budget_mb,rss_mb\n")
            for i, m in enumerate(gen.metrics):
                out.write(f"{i},{m.n_tokens},{m.drafted},{m.accepted},{m.probed},{m.bytes_read / 2**20:.3f},"
                          f"{m.cache_hits},{m.cache_lookups},{m.cache_budget_bytes / 2**20:.1f},"
                          f"{m.rss_bytes / 2**20:.1f}\n")
    decode = gen.metrics[1:]  # after the prompt's step
    wall_s = sum(m.wall_ms for m in decode) / 1000
    verifies = [m for m in decode if m.drafted]
    decodes = [m for m in decode if m.n_tokens]
    return {
        "speculative_used": info.get("speculative", ""), "cache_budget_mb": round(info["cache_budget_mb"], 1),
        "load_s": round(load_s, 2), "tokens": len(gen.tokens),
        "tokens_digest": hashlib.sha256(json.dumps(gen.tokens).encode()).hexdigest()[:12],
        "decodes": len(decodes), "drafted": sum(m.drafted for m in decode),
        "accepted": sum(m.accepted for m in decode), "verify_steps": len(verifies),
        "decode_tok_s": round((len(gen.tokens) - 1) / wall_s, 3) if wall_s else 0.0,
        "mib_read_per_token": round(sum(m.bytes_read for m in decode) / 2**20 / max(1, len(decode)), 3),
        "mib_read_per_decode": round(sum(m.bytes_read for m in decodes) / 2**20 / max(1, len(decodes)), 3),
        "mib_read_per_verify": round(sum(m.bytes_read for m in verifies) / 2**20 / len(verifies), 3)
        if verifies else 0.0,
        "hit_pct": round(100 * sum(m.cache_hits for m in decode) / max(1, sum(m.cache_lookups for m in decode)), 1),
        "stall_ms_per_token": round(sum(m.stall_ms for m in decode) / max(1, len(decode)), 1),
    }


def spawn(spec: dict[str, Any], cap_bytes: int, storage: Any) -> dict[str, Any]:
    from bmoe_edge.bench import ramcap
    from bmoe_edge.bench import storage as st
    from bmoe_edge.bench.machine import drop_page_cache, loadavg

    model = Path(spec["model"])
    limit = st.read_limit(storage, model) if storage is not None else None
    cap = ramcap.make_cap(cap_bytes, read_limit=limit)
    drop_page_cache(model)
    if draft_model(model, spec["speculative"]):  # cold too, and charged to the cell that reads it
        drop_page_cache(Path(draft_model(model, spec["speculative"])))
    la = loadavg()
    cap.prepare()
    try:
        proc = subprocess.run([sys.executable, __file__, "--cell", json.dumps(spec)], capture_output=True,
                              text=True, preexec_fn=cap.preexec, timeout=1800)
    finally:
        capped = cap.finish()
    record = {"status": "crashed", "error": " | ".join(proc.stderr.strip().splitlines()[-3:])}
    for line in proc.stdout.splitlines():
        if line.startswith(RECORD):
            record = {"status": "ok"} | json.loads(line[len(RECORD):])
    return record | {"loadavg": la,
                     "cap_mb": round(capped.limit_bytes / 2**20, 1),
                     "cap_peak_mb": round(capped.max_usage_bytes / 2**20, 1), "oom_kills": capped.oom_kills,
                     "throttle": capped.throttle, "throttled_mib": round(capped.throttled_read_bytes / 2**20, 1)}


def summary(rows: list[dict[str, Any]]) -> None:
    print("\n| head | spec | used | tok/s median | ratio to off (per repeat) | accepted/drafted | decodes "
          "| MiB/token | MiB/decode | MiB/verify | hit % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for head in HEADS:
        off = {r["repeat"]: r for r in rows if r["head"] == head and r["speculative"] == "off" and r["status"] == "ok"}
        for spec in SPECS:
            pick = [r for r in rows if r["head"] == head and r["speculative"] == spec and r["status"] == "ok"]
            if not pick:
                continue
            ratios = sorted(r["decode_tok_s"] / off[r["repeat"]]["decode_tok_s"] for r in pick if r["repeat"] in off)
            med = statistics.median(r["decode_tok_s"] for r in pick)
            # medians over the repeats (read-ahead auto and the cache's pressure make the counts vary)
            r0 = {k: statistics.median(float(r[k]) for r in pick) for k in (
                "accepted", "drafted", "decodes", "mib_read_per_token", "mib_read_per_decode",
                "mib_read_per_verify", "hit_pct")} | {"speculative_used": pick[0]["speculative_used"]}
            ratio = f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})" if ratios else "-"
            print(f"| {head} | {spec} | {r0['speculative_used']} | {med:.2f} | {ratio} "
                  f"| {r0['accepted']:.0f}/{r0['drafted']:.0f} | {r0['decodes']:.0f} | {r0['mib_read_per_token']:.1f} "
                  f"| {r0['mib_read_per_decode']:.1f} | {r0['mib_read_per_verify']:.1f} | {r0['hit_pct']} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell")
    ap.add_argument("--out", default=str(Path(__file__).parent))
    ap.add_argument("--arch", default="glm4moe")
    ap.add_argument("--storage", default="rpi5-nvme-gen2")
    ap.add_argument("--cap", default="40%")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--summary", help="print the table of an existing cells CSV")
    ap.add_argument("--trace", help="a directory: each cell also writes its per-step rows there")
    ap.add_argument("--heads", default=",".join(HEADS), help="the heads to run (agree,random)")
    a = ap.parse_args()
    if a.cell:
        print(RECORD + json.dumps(measure(json.loads(a.cell))), flush=True)
        return
    if a.summary:
        with open(a.summary) as f:
            rows = [{k: (float(v) if k.endswith(("tok_s", "per_token", "per_decode", "per_verify", "pct"))
                         else int(v) if k in ("repeat", "drafted", "accepted", "decodes") else v)
                     for k, v in r.items()} for r in csv.DictReader(f)]
        summary(rows)
        return
    from bmoe_edge.bench import ramcap
    from bmoe_edge.bench import storage as st
    from bmoe_edge.cli.bench import storage_targets

    storage = st.parse_storage(a.storage, storage_targets())
    models = {head: fixture(a.arch, head) for head in a.heads.split(",")}
    out = Path(a.out)
    name = f"cells-{a.arch}-{storage.name if storage else 'native'}.csv"
    rows: list[dict[str, Any]] = []
    for rep in range(a.repeats):
        for head, model in models.items():
            cap_bytes = ramcap.parse_cap(a.cap, model.stat().st_size)
            order = SPECS[rep % 3:] + SPECS[:rep % 3]
            for spec in order:
                cell = {"model": str(model), "speculative": spec, "tokens": a.tokens}
                if a.trace:
                    cell["trace"] = str(Path(a.trace) / f"trace-{a.arch}-{head}-{spec}-r{rep}.csv")
                r = {"repeat": rep, "arch": a.arch, "head": head, "speculative": spec,
                     "storage": storage.name if storage else "native"} | spawn(cell, cap_bytes, storage)
                rows.append(r)
                print(json.dumps(r), flush=True)
        with open(out / name, "w", newline="") as f:  # after every repeat: a killed run keeps its data
            keys = list(dict.fromkeys(k for r in rows for k in r))
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
    summary(rows)


if __name__ == "__main__":
    main()
