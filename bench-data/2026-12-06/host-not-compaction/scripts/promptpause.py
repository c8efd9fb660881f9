"""A warm streamed engine (every expert cached), then prompts of N tokens it has not seen, each after a pause
(bench kernels runs llama-bench between them): python promptpause.py MODEL THREADS N PAUSE_S COUNT"""
import os, sys, time
from pathlib import Path
from bmoe_edge.engine import Engine, report
from full_cache import config
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS, _prompt_ids
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); n = int(sys.argv[3]); pause = float(sys.argv[4]); count = int(sys.argv[5])
cfg = config(model, t, ctx=n + 64)
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    e.run(_prompt_ids(e.tokenize, n, 99), 1)
    out = []
    for i in range(count):
        time.sleep(pause)
        g = e.run(_prompt_ids(e.tokenize, n, i), 1)
        s = report.summary(g, e.run_info)
        out.append(round(float(s["prompt_tok_s"]), 2))
        released = g.metrics[0].released_bytes
    print(os.environ.get("BMOE_DIAG_KEEP_SCRATCH", "give-back"), "pause", pause, "prompt tok/s", out, "released MiB", released >> 20, flush=True)
