import math, os, sys, statistics as st
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS, _prompt_ids
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2])
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=max(base.ctx, 768), cache_mb=float(full_mb), flash_attn=False)
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS); e.run(_prompt_ids(e.tokenize, 512, -1), 1)
    res = {"plain": [], "after-prompt": []}
    for r in range(5):
        for which in ("plain", "after-prompt"):
            if which == "after-prompt":
                e.run(_prompt_ids(e.tokenize, 512, r), 1)
            g = e.run(PROMPT, 65)
            s = report.summary(g, e.run_info)
            res[which].append(float(s["decode_tok_s"]))
            if r == 0:
                print(which, [round(m.wall_ms, 1) for m in g.metrics[1:12]], sum(m.whole_graphs for m in g.metrics), flush=True)
    print({k: [round(x, 2) for x in v] for k, v in res.items()})
    print({k: round(st.median(v), 2) for k, v in res.items()})
