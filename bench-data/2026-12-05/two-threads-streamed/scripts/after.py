import math, os, sys, time, subprocess
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
from bmoe_edge.bench import llama_bench
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); mode = sys.argv[3]
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=256, flash_attn=False, cache_mb=float(full_mb))
if mode == "resident": cfg = replace(cfg, stream=False)
def kthreads():
    out = subprocess.run("ps -eo comm,time | grep -E 'kcompact|khugepage|kswapd|kworker' | awk '{print $2}'", shell=True, capture_output=True, text=True).stdout.split()
    return sum(int(h)*3600+int(m)*60+int(s) for h,m,s in (x.split(':') for x in out))
def run(label):
    g = e.run(PROMPT, 65)
    ms = sorted(m.wall_ms for m in g.metrics[2:])
    print(label, round(report.summary(g, e.run_info)["decode_tok_s"], 2), "p10", round(ms[len(ms)//10], 2), "med", round(ms[len(ms)//2], 2), flush=True)
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    for cycle in range(3):
        for i in range(4): run(f"c{cycle} before")
        k0 = kthreads()
        lb = llama_bench.run(model, threads=t, decode_tokens=64, prompt_tokens=0, flash_attn="off", repetitions=3)["decode_samples"]
        print("   llama-bench", [round(x,1) for x in lb], flush=True)
        for i in range(4): run(f"c{cycle} after")
        time.sleep(5)
        run(f"c{cycle} after+5s")
        print("   kthread cpu s", kthreads() - k0, flush=True)
