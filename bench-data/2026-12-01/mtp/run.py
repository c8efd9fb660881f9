"""--speculative mtp against plain greedy decoding, side by side (bench-data/2026-12-01/mtp).

Fixtures: glm4moe with 8 trunk layers (n_embd 256, experts 512 wide, 8 experts, top-2, Q8_0, 48 MiB)
and one MTP block, written by bmoe_edge.synthetic.mtp_rows with three heads: agree (the trunk's last
layer, the token's embedding passed through), noisy (agree plus random eh_proj weights), random.
Cells: head x (off, mtp) x (streamed with the cache off, streamed with a 25% cache, resident),
REPEATS interleaved repeats; 1 compute thread, 4 read lanes, overlap auto, prefetch off (read-ahead
decides by timing: its reads would make the bytes per token vary). Writes cells.csv (one row per
run) and prints a summary table.

    .venv/bin/python bench-data/2026-12-01/mtp/run.py [OUT_DIR [ARCH [REPEATS]]]

ARCH: glm4moe (the default; cells.csv) or qwen35moe (its trunk hybrid: cells-qwen35moe.csv).
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

from bmoe_edge.engine import Engine, StreamConfig, info
from bmoe_edge.synthetic import mtp_rows

HEADS = ("agree", "noisy", "random")
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
TOKENS = 192
REPEATS = 5
CACHE = {"cache-off": 0.0, "cache-25pct": 0.25, "resident": None}


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    arch = sys.argv[2] if len(sys.argv) > 2 else "glm4moe"
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else REPEATS
    cache = Path.home() / ".cache/bmoe-edge/bench-mtp"
    cache.mkdir(parents=True, exist_ok=True)
    models = {}
    for head in HEADS:
        stem = f"mtp-{head}" if arch == "glm4moe" else f"mtp-{arch}-{head}"
        path = cache / f"{stem}-l8-e256-f512.gguf"
        if not path.is_file():
            mtp_rows.write_mtp_moe(path, arch, "Q8_0", head=head, n_layer=8, n_embd=256, n_ff_exp=512)
        models[head] = path
    expert_mb = info.model_summary(models["agree"]).expert_bytes / 2**20  # the trunk's and the head's
    rows = []
    plain_tokens: dict[str, list[int]] = {}
    for rep in range(repeats):
        for head, model in models.items():
            for cell, frac in CACHE.items():
                for spec in ("off", "mtp"):
                    if frac is None:
                        config = StreamConfig(stream=False, threads=1, prefetch="off", speculative=spec)
                    else:
                        config = StreamConfig(threads=1, cache_mb=frac * expert_mb, prefetch="off", speculative=spec)
                    with Engine(model, config) as engine:
                        t0 = time.perf_counter()
                        gen = engine.run(PROMPT, TOKENS)
                        wall = time.perf_counter() - t0
                    decode_s = sum(m.wall_ms for m in gen.metrics[1:]) / 1000  # after the prompt
                    plain_tokens.setdefault(head, gen.tokens)
                    rows.append({
                        "repeat": rep, "head": head, "cell": cell, "speculative": spec,
                        "tokens": len(gen.tokens), "same_tokens": gen.tokens == plain_tokens[head],
                        "decodes": sum(1 for m in gen.metrics if m.n_tokens),
                        "drafted": sum(m.drafted for m in gen.metrics),
                        "accepted": sum(m.accepted for m in gen.metrics),
                        "decode_tok_s": round((len(gen.tokens) - 1) / decode_s, 2) if decode_s else 0,
                        "bytes_read_per_token": round(sum(m.bytes_read for m in gen.metrics) / len(gen.tokens)),
                        "stall_ms": round(sum(m.stall_ms for m in gen.metrics), 1),
                        "wall_s": round(wall, 3),
                    })
                    print(rows[-1], flush=True)
    with open(out / ("cells.csv" if arch == "glm4moe" else f"cells-{arch}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print("\n| head | cell | off tok/s | mtp tok/s | ratio (per repeat) | accepted/drafted | decodes "
          "| MiB/token off -> mtp |")
    print("|---|---|---|---|---|---|---|---|")
    for head in HEADS:
        for cell in CACHE:
            pick = {s: [r for r in rows if r["head"] == head and r["cell"] == cell and r["speculative"] == s]
                    for s in ("off", "mtp")}
            ratios = [m["decode_tok_s"] / o["decode_tok_s"] for o, m in zip(pick["off"], pick["mtp"], strict=True)]
            med = sorted(ratios)[len(ratios) // 2]
            off = sorted(r["decode_tok_s"] for r in pick["off"])[repeats // 2]
            mtp = sorted(r["decode_tok_s"] for r in pick["mtp"])[repeats // 2]
            m0 = pick["mtp"][0]
            o0 = pick["off"][0]
            print(f"| {head} | {cell} | {off:.0f} | {mtp:.0f} | {med:.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
                  f"{m0['accepted']}/{m0['drafted']} | {o0['decodes']} -> {m0['decodes']} | "
                  f"{o0['bytes_read_per_token'] / 2**20:.2f} -> {m0['bytes_read_per_token'] / 2**20:.2f} |")


if __name__ == "__main__":
    main()
