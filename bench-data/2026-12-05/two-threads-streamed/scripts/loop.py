import math, os, sys
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); stream = sys.argv[3] == "stream"
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=256, flash_attn=False, cache_mb=float(full_mb))
if not stream: cfg = replace(cfg, stream=False)
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    open("/tmp/diag/ready", "w").write(str(os.getpid()))
    for _ in range(int(sys.argv[4])):
        g = e.run(PROMPT, 129)
        ms = sorted(m.wall_ms for m in g.metrics[2:])
        print(round(report.summary(g, e.run_info)["decode_tok_s"], 2), "p10", round(ms[len(ms)//10], 2), "med", round(ms[len(ms)//2], 2), flush=True)
