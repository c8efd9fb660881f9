"""The A/B table of serve/cells.csv: per model and cell, frequency (the new cache) against lru (BMOE_CACHE_POLICY=lru)
in the same repeat. This run's servers predate bmoe_batch_decode_bytes_read_total: a --parallel cell's
per-request counters hold each shared step once per client (every step of these cells has all C clients,
prompts included: one chunk holds them), so its decode bytes are (bytes_read - prefill_bytes_read) / C."""
import csv
import statistics
import sys
from collections import defaultdict

rows = list(csv.DictReader(open(sys.argv[1])))
by = defaultdict(dict)
for r in rows:
    by[(r["model"], r["repeat"])][r["cell"]] = r


def per_token_mb(r):
    c = int(r["clients"])
    share = c if int(r["parallel"]) > 1 else 1
    decoded = float(r["tokens"]) - c
    return (float(r["bytes_read"]) - float(r["prefill_bytes_read"])) / share / decoded / 1e6


out = defaultdict(lambda: defaultdict(list))
for (model, rep), cells in by.items():
    for label, r in cells.items():
        policy = "lru" if label.endswith("-lru") else "frequency"
        base = cells.get("p1-c1" + ("-lru" if policy == "lru" else ""))
        cell = label.removesuffix("-lru")
        x = float(r["aggregate_tok_s"]) / float(base["aggregate_tok_s"]) if base else float("nan")
        twin = cells.get(cell + ("" if policy == "lru" else "-lru"))
        out[(model, cell)][policy].append((float(r["aggregate_tok_s"]), x, per_token_mb(r),
                                           float(r["last_ttft_s"]) / max(1e-9, float(r["first_ttft_s"]))))
        if policy == "frequency" and twin:
            out[(model, cell)]["paired"].append(float(r["aggregate_tok_s"]) / float(twin["aggregate_tok_s"]))
print("| model | cell | policy | repeats | tok/s (each) | x own p1-c1 (each) | x median | MB read per decoded token (median) | last/first TTFT (each) |")
print("|---|---|---|---|---|---|---|---|---|")
for (model, cell), d in sorted(out.items()):
    for policy in ("frequency", "lru"):
        v = d.get(policy, [])
        if not v:
            continue
        print(f"| {model.split('-')[-1]} | {cell} | {policy} | {len(v)} | {', '.join(f'{a[0]:.2f}' for a in v)} | "
              f"{', '.join(f'{a[1]:.2f}' for a in v)} | {statistics.median(a[1] for a in v):.2f} | "
              f"{statistics.median(a[2] for a in v):.0f} | {', '.join(f'{a[3]:.1f}' for a in v)} |")
    if d.get("paired"):
        print(f"| {model.split('-')[-1]} | {cell} | frequency / lru tok/s, same repeat | | "
              f"{', '.join(f'{p:.2f}' for p in d['paired'])} | | {statistics.median(d['paired']):.2f} | | |")
