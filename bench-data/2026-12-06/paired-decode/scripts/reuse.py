"""Whole decode runs after a prompt (as bench kernels runs them) against the same runs after a 1-token
resumption of the prompt kept in the KV cache (reuse_kv), taking turns in one process:
python reuse.py MODEL THREADS ROUNDS"""
import os, sys, statistics as st
from pathlib import Path
from bmoe_edge.engine import Engine
from bmoe_edge.engine.generation import Generation
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "host-not-compaction" / "scripts"))
from full_cache import config  # session 26's engine settings, shared, not copied
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); rounds = int(sys.argv[3])

def tok_s(gen):
    d = gen.metrics[1:]
    return 1000 * len(d) / sum(m.wall_ms for m in d)

def reuse_run(e):
    g = Generation([])
    for _ in e.generate(PROMPT, 65, result=g, reuse_kv=True):
        pass
    return g

with Engine(model, config(model, t)) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    for r in range(rounds):
        a = [tok_s(e.run(PROMPT, 65)) for _ in range(5)]
        c = [tok_s(reuse_run(e)) for _ in range(5)]
        first = reuse_run(e)
        print(f"{r} prompt:  med {st.median(a):.2f} min {min(a):.2f} max {max(a):.2f}  | reuse: med {st.median(c):.2f} min {min(c):.2f} max {max(c):.2f}"
              f"  (reused {first.reused_tokens}, first step {first.metrics[0].n_tokens} tokens)", flush=True)
