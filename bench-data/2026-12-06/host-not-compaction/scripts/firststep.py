"""Per-step decode times of the engine's runs as bench kernels makes them: the first decode after the prompt
against the rest. python firststep.py MODEL THREADS MODE [runs]"""
import os, statistics as st, sys
from pathlib import Path
from bmoe_edge.engine import Engine, report
from full_cache import config
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); mode = sys.argv[3]; runs = int(sys.argv[4]) if len(sys.argv) > 4 else 8
cfg = config(model, t, mode=mode)
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    for r in range(runs):
        g = e.run(PROMPT, 65)
        ms = [m.wall_ms for m in g.metrics]
        rest = sorted(ms[2:])
        print(mode, r, "tok/s", round(report.summary(g, e.run_info)["decode_tok_s"], 2), "prompt", round(ms[0], 1), "first decode", round(ms[1], 2),
              "second", round(ms[2], 2), "p10", round(rest[len(rest)//10], 2), "med", round(rest[len(rest)//2], 2), "max", round(rest[-1], 2),
              "mean(rest)", round(st.mean(rest), 2), flush=True)
