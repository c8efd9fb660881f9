import math, os, sys, time
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); mode = sys.argv[3]
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=256, flash_attn=False, cache_mb=float(full_mb))
if mode == "resident": cfg = replace(cfg, stream=False)
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    for i in range(5):
        c0 = time.process_time(); w0 = time.perf_counter()
        g = e.run(PROMPT, 65)
        w = (time.perf_counter() - w0) * 1000; c = (time.process_time() - c0) * 1000
        steps = sum(m.wall_ms for m in g.metrics)
        print(f"run wall {w:.1f} ms, steps {steps:.1f} (prompt step {g.metrics[0].wall_ms:.1f}), outside {w - steps:.1f} ms = {(w-steps)/64:.3f} ms/token; cpu {c:.0f} ms = {c/w:.2f} cores", flush=True)
