"""The tails of the engine's decode steps against llama-bench's 1-token decodes at the same positions, taking turns
in one window: python tails.py MODEL THREADS ROUNDS"""
import os, statistics as st, sys
from pathlib import Path
from bmoe_edge.engine import Engine
from full_cache import config
from bmoe_edge.bench import llama_bench, kernels
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); rounds = int(sys.argv[3])
cfg = config(model, t)
def q(v, f): v = sorted(v); return v[int(f * (len(v) - 1))]
with Engine(model, cfg) as e:
    n = len(e.run(PROMPT, WARMUP_TOKENS).prompt_tokens)
    for r in range(rounds):
        eng = []
        for _ in range(2):
            eng += [m.wall_ms for m in e.run(PROMPT, 65).metrics[2:]]
        lb = [1000 / x for x in llama_bench.run(model, threads=t, decode_tokens=1, prompt_tokens=0, repetitions=16,
                                                flash_attn="off", depths=kernels.token_depths(n, 64))["decode_samples"]]
        for name, v in (("engine", eng), ("llama-bench", lb)):
            print(r, f"{name:11s} n={len(v)} p10 {q(v,.1):.2f} med {q(v,.5):.2f} p90 {q(v,.9):.2f} mean {st.mean(v):.2f} mean/p10 {st.mean(v)/q(v,.1):.3f}", flush=True)
