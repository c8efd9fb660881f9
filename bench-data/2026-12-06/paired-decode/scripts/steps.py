"""One engine's warm runs of 64 tokens, each run's decode steps: tok/s and step-time quantiles (ms), or with `seq`
every step's time in order. python steps.py MODEL stream|resident RUNS [seq] (two threads, full_cache.config)"""
import os, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "host-not-compaction" / "scripts"))
from full_cache import config  # session 26's engine settings, shared, not copied
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
from bmoe_edge.engine import Engine
model = Path(os.path.expanduser(sys.argv[1])); mode = sys.argv[2]; runs = int(sys.argv[3])
in_order = len(sys.argv) > 4 and sys.argv[4] == "seq"
with Engine(model, config(model, 2, ctx=128, mode=mode)) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    for r in range(runs):
        g = e.run(PROMPT, 65)
        if in_order:
            print(mode, r, " ".join(f"{m.wall_ms:.0f}" for m in g.metrics[1:]), flush=True)
            continue
        ms = sorted(m.wall_ms for m in g.metrics[2:])
        q = lambda f: ms[int(f * (len(ms) - 1))]
        print(f"{mode} {r:2d} {1000*len(ms)/sum(ms):6.2f} tok/s  p10 {q(.1):5.2f} p50 {q(.5):5.2f} p90 {q(.9):5.2f} "
              f"max {ms[-1]:6.2f}", flush=True)
