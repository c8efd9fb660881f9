"""Engine-level batching under the cap: one prompt alone vs 4 together, P=1 and P=4 engines."""
import json, sys, time
from dataclasses import replace
from bmoe_edge.engine import Engine
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.engine.batching import generate_together
from bmoe_edge.bench.serve_bench import PROMPTS
model, parallel, n, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cfg = StreamConfig(threads=1, ctx=512, parallel=parallel)
with Engine(model, cfg) as e:
    info = e.run_info
    prompts = [e.tokenize(p) for p in PROMPTS[:n]]
    generate_together(e, [prompts[0]], 4)  # warm
    steps = []
    t0 = time.perf_counter()
    gens = generate_together(e, prompts, tokens, steps=steps)
    wall = time.perf_counter() - t0
    dec = [s for s in steps if s.n_decoding == s.n_sequences]
    ms = [m for g in gens for m in g.metrics]
    last = gens[0].metrics[-1]
    print(json.dumps({"parallel": parallel, "clients": n, "tok_s": sum(len(g.tokens) for g in gens) / wall,
        "decode_steps": len(dec), "decode_ms_per_step": sum(s.wall_ms for s in dec) / max(1, len(dec)),
        "bytes_read_per_step_MB": sum(s.bytes_read for s in dec) / max(1, len(dec)) / 2**20,
        "union_over_summed": sum(s.union_bytes for s in dec) / max(1, sum(s.summed_bytes for s in dec)),
        "cache_budget_MB": last.cache_budget_bytes / 2**20, "stall_ms": last.stall_ms, "read_ahead": last.read_ahead,
        "hit": sum(m.cache_hits for m in ms) / max(1, sum(m.cache_lookups for m in ms))}))
