import math, os, sys, statistics as st, time, json, resource
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench import llama_bench
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS, _prompt_ids
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); reps = int(sys.argv[3])
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=768, flash_attn=False, cache_mb=float(full_mb))
KEYS = ("pgmigrate_success", "compact_migrate_scanned", "compact_free_scanned", "thp_collapse_alloc", "compact_stall", "pgfault", "thp_split_pmd", "numa_hint_faults")
def vm():
    d = {}
    for l in open("/proc/vmstat"):
        k, v = l.split(); d[k] = int(v)
    return d
def erun(e):
    v0 = vm(); f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    g = e.run(PROMPT, 33)
    v1 = vm(); f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ms = [m.wall_ms for m in g.metrics[1:]]
    return {"tok_s": round(1000 * len(ms) / sum(ms), 2), "max_ms": max(ms), "minflt": f1 - f0, **{k: v1.get(k, 0) - v0.get(k, 0) for k in KEYS}}
out = []
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS); e.run(_prompt_ids(e.tokenize, 512, -1), 1)
    for r in range(reps):
        rec = {"r": r}
        v0 = vm()
        rec["lb"] = llama_bench.run(model, threads=t, decode_tokens=32, prompt_tokens=0, flash_attn="off")["decode_tok_s"]
        v1 = vm(); rec["lb_vm"] = {k: v1.get(k, 0) - v0.get(k, 0) for k in KEYS}
        rec["e_after_lb"] = erun(e)
        rec["e_second"] = erun(e)
        time.sleep(5)
        rec["e_after_5s"] = erun(e)
        print(json.dumps(rec), flush=True); out.append(rec)
for k in ("e_after_lb", "e_second", "e_after_5s"):
    print(k, "ratio med", round(st.median(r[k]["tok_s"] / r["lb"] for r in out), 3))
