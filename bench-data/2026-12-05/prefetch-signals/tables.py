"""The held-out check's table (docs/benchmarks.md) from each campaign's targets.json: `python tables.py`."""
import json
from pathlib import Path

HERE = Path(__file__).parent
print("| class | preset | tokens | repeats | `defaults` tok/s | best one-knob rival | defaults / best (≥ 0.95) "
      "| defaults / I/O limit (≥ 0.9) |")
print("|---|---|---|---|---|---|---|---|")
for targets in sorted(HERE.glob("*-Q4_*-*/targets.json")):
    klass, quant, tokens = targets.parent.name.rsplit("-", 2)
    t = json.loads(targets.read_text()).get("one_knob")
    if not t:
        continue
    rows = t["by_repeat"]
    tok_s = "-".join(f"{x:.3g}" for x in sorted({min(r["tok_s"] for r in rows), max(r["tok_s"] for r in rows)}))
    best = ", ".join(sorted({r["best"].removeprefix("defaults-") for r in rows}))
    met = lambda v, target: f"{v:.2f} {'met' if v >= target else '**missed**'}"  # noqa: E731
    print(f"| {klass} | {quant} | {tokens} | {len(rows)} | {tok_s} | {best} | {met(t['ratio'], 0.95)} | "
          f"{met(t['io_ratio'], 0.9)} |")
