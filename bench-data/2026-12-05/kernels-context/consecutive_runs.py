import math, os, sys, statistics as st, time, json
from dataclasses import replace, asdict
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2])
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=256, flash_attn=False, cache_mb=float(full_mb))
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    t0 = time.perf_counter()
    for k in range(int(sys.argv[3])):
        s = time.perf_counter()
        g = e.run(PROMPT, 65)
        ms = [m.wall_ms for m in g.metrics[1:]]
        slow = sorted(range(len(ms)), key=lambda i: -ms[i])[:3]
        print(k, round(s - t0, 2), round(1000 * len(ms) / sum(ms), 2), "prompt step ms", round(g.metrics[0].wall_ms, 1), [(i, round(ms[i], 1), g.metrics[i + 1].stall_ms, g.metrics[i + 1].io_ms, g.metrics[i+1].cache_budget_bytes >> 20, g.metrics[i+1].pool_bytes >> 20) for i in slow], flush=True)
