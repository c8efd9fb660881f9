import math, os, sys, time
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS, _prompt_ids
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); fa = sys.argv[3] if len(sys.argv) > 3 else "auto"
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
config = replace(base, threads=t, repack="auto", ctx=768, cache_mb=float(full_mb), flash_attn=fa)
with Engine(model, config) as e:
    e.run(PROMPT, WARMUP_TOKENS); e.run(_prompt_ids(e.tokenize, 512, -1), 1)
    res = {"on": [], "off": []}; ids = {}
    for r in range(8):
        for which in (("on", "off") if r % 2 == 0 else ("off", "on")):
            if which == "on": os.environ["BMOE_NO_WHOLE"] = "1"
            else: os.environ.pop("BMOE_NO_WHOLE", None)
            out = e.run(PROMPT, 33)
            s = report.summary(out, e.run_info)
            res[which].append(float(s["decode_tok_s"]))
            ids.setdefault(which, out.tokens if hasattr(out, "tokens") else None)
            if r == 0: print(which, s.get("cache_hit_pct"), s.get("decode_tok_s"), sum(mm.whole_graphs for mm in out.metrics))
    import statistics as st
    print({k: [round(x, 2) for x in v] for k, v in res.items()})
    ratios = [a / b for a, b in zip(res["on"], res["off"])]
    print("median on/off", round(st.median(ratios), 3), "same ids:", ids.get("on") == ids.get("off"))
