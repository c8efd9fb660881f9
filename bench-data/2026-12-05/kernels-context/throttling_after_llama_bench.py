import math, os, sys, statistics as st, time, json, resource
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench import llama_bench
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); cycles = int(sys.argv[3])
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=256, flash_attn=False, cache_mb=float(full_mb))
VM = ("pgfault", "pgfree", "thp_fault_alloc", "thp_collapse_alloc", "pgmigrate_success", "compact_stall", "compact_migrate_scanned", "pgsteal_kswapd", "pgscan_kswapd", "thp_split_pmd", "nr_free_pages")
def vm():
    d = {}
    for l in open("/proc/vmstat"):
        k, v = l.split(); d[k] = int(v)
    return d
def cpu():
    out = {}
    for l in open("/proc/stat"):
        if l.startswith("cpu") and l[3] != " ":
            f = l.split(); out[f[0]] = [int(x) for x in f[1:9]]  # user nice system idle iowait irq softirq steal
    return out
def erun(e):
    v0, c0, r0 = vm(), cpu(), resource.getrusage(resource.RUSAGE_SELF)
    g = e.run(PROMPT, 65)
    v1, c1, r1 = vm(), cpu(), resource.getrusage(resource.RUSAGE_SELF)
    ms = [m.wall_ms for m in g.metrics[1:]]
    dc = {k: [b - a for a, b in zip(c0[k], c1[k])] for k in c0}
    return {"ms": [round(x) for x in ms], "t_end": round(time.time() % 1000, 2), "tok_s": round(1000 * len(ms) / sum(ms), 2), "med_ms": round(st.median(ms), 2), "max_ms": round(max(ms), 1),
            "whole": sum(m.whole_graphs for m in g.metrics[1:]), "read": sum(m.bytes_read for m in g.metrics),
            "released": sum(m.released_bytes for m in g.metrics), "minflt": r1.ru_minflt - r0.ru_minflt,
            "nvcsw": r1.ru_nvcsw - r0.ru_nvcsw, "nivcsw": r1.ru_nivcsw - r0.ru_nivcsw,
            "cpu(sys,idle,steal,softirq)": {k: (v[2], v[3], v[7], v[6]) for k, v in dc.items()},
            **{k: v1.get(k, 0) - v0.get(k, 0) for k in VM if k != "nr_free_pages"}, "free_mb": v1["nr_free_pages"] * 4 // 1024}
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    for c in range(cycles):
        lb = llama_bench.run(model, threads=t, decode_tokens=64, prompt_tokens=0, flash_attn="off", repetitions=5)
        print(json.dumps({"cycle": c, "lb": lb["decode_samples"]}), flush=True)
        for k in range(6):
            print(json.dumps({"cycle": c, "run": k, **erun(e)}), flush=True)
