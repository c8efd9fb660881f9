"""Long stretches: llama-bench tg64 x REPS in one process (at the engine's depth, flash attention off), then as many
of one engine's warm runs of 64 tokens, ROUNDS times; each side's per-run tok/s in order.
MODE=stream|resident python long.py MODEL THREADS REPS ROUNDS (the engine: full_cache.config)"""
import os, sys, time, statistics as st
from pathlib import Path
from bmoe_edge.engine import Engine
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "host-not-compaction" / "scripts"))
from full_cache import config  # session 26's engine settings, shared, not copied
from bmoe_edge.bench import llama_bench
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
MODE = os.environ.get("MODE", "stream")
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); reps = int(sys.argv[3]); rounds = int(sys.argv[4])
def ts(g):
    d = g.metrics[1:]; return 1000 * len(d) / sum(m.wall_ms for m in d)
def show(name, v):
    q = sorted(v)
    print(f"  {name}: n={len(v)} min {q[0]:.1f} p10 {q[len(q)//10]:.1f} med {st.median(v):.1f} max {q[-1]:.1f} | " + " ".join(f"{x:.0f}" for x in v), flush=True)
with Engine(model, config(model, t, mode=MODE)) as e:
    n = len(e.run(PROMPT, WARMUP_TOKENS).prompt_tokens)
    for r in range(rounds):
        t0 = time.monotonic()
        lb = llama_bench.run(model, threads=t, decode_tokens=64, prompt_tokens=0, repetitions=reps, flash_attn="off", depths=(n,))["decode_samples"]
        lbt = time.monotonic() - t0
        show(f"round {r} llama-bench ({lbt:.0f}s)", lb)
        v = [ts(e.run(PROMPT, 65)) for _ in range(reps)]
        show(f"round {r} engine", v)
