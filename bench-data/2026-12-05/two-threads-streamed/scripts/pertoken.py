"""Per-token decode time medians: engine (after a short prompt) vs llama-bench tg1 x R (each a 1-token decode)."""
import math, os, statistics, sys, json, subprocess
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
from bmoe_edge.bench import llama_bench
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); repeats = int(sys.argv[3])
fa = sys.argv[4] if len(sys.argv) > 4 else "off"
overrides = dict(a.split("=") for a in sys.argv[5:])
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=256, flash_attn=(fa != "off"), cache_mb=float(full_mb))
if overrides.get("stream") == "0":
    cfg = replace(cfg, stream=False)
def q(xs, p):
    xs = sorted(xs); return xs[int(p * (len(xs) - 1))]
def lb_tokens():
    cmd = [str(llama_bench.binary()), "-m", str(model), "-t", str(t), "-r", "150", "-o", "json", "-fa", fa, "-n", "1", "-p", "0"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return [1000.0 / x for x in out[0]["samples_ts"]]
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    for r in range(repeats):
        mine = []
        for _ in range(2):
            g = e.run(PROMPT, 76)
            mine += [m.wall_ms for m in g.metrics[2:]]
        lb = lb_tokens()
        print(f"r{r} engine median {statistics.median(mine):.2f} p25 {q(mine,.25):.2f} p10 {q(mine,.1):.2f} ms | "
              f"llama-bench median {statistics.median(lb):.2f} p25 {q(lb,.25):.2f} p10 {q(lb,.1):.2f} | "
              f"ratio (lb/engine) med {statistics.median(lb)/statistics.median(mine):.3f} p25 {q(lb,.25)/q(mine,.25):.3f} p10 {q(lb,.1)/q(mine,.1):.3f}", flush=True)
