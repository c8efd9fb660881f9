"""Engine decode tok/s after a short prompt vs after a 1-token prompt, paired with llama-bench tg64 (-r 5)."""
import math, os, statistics, sys, time
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
from bmoe_edge.bench import llama_bench
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); repeats = int(sys.argv[3])
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=256, flash_attn=False, cache_mb=float(full_mb))
def runs(e, prompt, n=5):
    out = []
    for _ in range(n):
        g = e.run(prompt, 65)
        out.append(report.summary(g, e.run_info)["decode_tok_s"])
        out.append([round(m.wall_ms, 1) for m in g.metrics[:4]])
    return out
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    one = e.tokenize(PROMPT)[:1]
    for r in range(repeats):
        a = runs(e, PROMPT); b = runs(e, one)
        lb = llama_bench.run(model, threads=t, decode_tokens=64, prompt_tokens=0, flash_attn="off", repetitions=5)["decode_samples"]
        am = statistics.median(a[0::2]); bm = statistics.median(b[0::2]); lm = statistics.median(lb)
        print(f"r{r} prompt {am:.2f} one-token {bm:.2f} llama-bench {lm:.2f} | ratios {am/lm:.3f} {bm/lm:.3f}", flush=True)
        print("   prompt runs", [round(x, 1) for x in a[0::2]], "first steps", a[1::2][:2], flush=True)
        print("   one runs", [round(x, 1) for x in b[0::2]], "first steps", b[1::2][:2], flush=True)
        print("   lb runs", [round(x, 1) for x in lb], flush=True)
