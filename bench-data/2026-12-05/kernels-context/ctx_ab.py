import math, os, sys, statistics as st
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2])
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
engines = {c: Engine(model, replace(base, threads=t, repack="auto", ctx=c, flash_attn=os.environ.get("FA","off") == "auto" and "auto" or False, cache_mb=float(full_mb))) for c in (256, 768)}
for e in engines.values(): e.run(PROMPT, WARMUP_TOKENS)
res = {c: [] for c in engines}
for r in range(5):
    for c, e in engines.items():
        res[c].append(report.summary(e.run(PROMPT, 129), e.run_info)["decode_tok_s"])
    print({c: round(v[-1], 2) for c, v in res.items()}, flush=True)
print({c: round(st.median(v), 2) for c, v in res.items()})
for e in engines.values(): e.close()
