"""Record the real routing of 1, 2 and 4 sequences decoding together (the bench's prompts, greedy), one
`--parallel 4` engine per run with the route trace on, plus the model's expert sizes for the simulator.

    python record_traces.py MODEL LABEL TOKENS OUTDIR

Routing does not depend on the cache (streamed == resident), so the traces are taken without a RAM cap:
they are the requests `bench serve` sends (a 4-token warm-up, then C clients together), replayed offline by
`bmoe_edge.bench.cache_sim` at the budgets the capped servers measured.
"""
import json
import sys
from pathlib import Path

from bmoe_edge.bench.layout import gguf_layout
from bmoe_edge.bench.serve_bench import PROMPTS
from bmoe_edge.engine import Engine
from bmoe_edge.engine.batching import generate_together
from bmoe_edge.engine.settings import StreamConfig

model, label, tokens, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
out.mkdir(parents=True, exist_ok=True)
for n in (1, 2, 4):
    trace = out / f"{label}-c{n}.csv"
    cfg = StreamConfig(threads=1, ctx=512, parallel=4, route_trace=str(trace))
    with Engine(model, cfg) as e:
        warm = e.tokenize("Warm up")
        generate_together(e, [warm], 4)
        prompts = [e.tokenize(p) for p in PROMPTS[:n]]
        gens = generate_together(e, prompts, tokens)
        info = e.run_info
    layout = gguf_layout(Path(model))
    meta = {"model": Path(model).name, "clients": n, "tokens": tokens, "warmup_steps": 4,
            "tokens_out": [len(g.tokens) for g in gens], "n_expert": layout.n_expert,
            "n_expert_used": layout.n_expert_used,
            "expert_bytes": [layout.bytes_per_expert(il) for il in sorted(layout.layers())]}
    for k in dir(info):
        if not k.startswith("_"):
            v = getattr(info, k)
            if isinstance(v, (int, float, str, bool)) or (isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)):
                meta[k] = v
    (out / f"{label}-c{n}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(label, n, "done", flush=True)
