# The cache budget after a 16-token prompt by context and batch, each in a fresh process under a 1107 MiB cap.
# usage: budget_by_ctx.py MODEL   (output: one JSON line per configuration; recorded in findings.md)
import json, subprocess, sys
from bmoe_edge.bench import ramcap
code = r'''
import json, sys
from bmoe_edge.engine import Engine, StreamConfig
from bmoe_edge.bench.machine import long_prompt
ctx, ub = int(sys.argv[2]), int(sys.argv[3])
with Engine(sys.argv[1], StreamConfig(ctx=ctx, batch=ub, ubatch=ub, threads=1)) as e:
    i = e.run_info
    g = e.run(long_prompt(e.tokenize, 16), 3)
    print(json.dumps({"ctx": ctx, "ubatch": ub, "open_budget": round(i["cache_budget_mb"]), "pending": round(i["memory_pending_mb"]),
        "headroom": round(i["memory_headroom_mb"]), "after_prompt": g.metrics[0].cache_budget_bytes >> 20,
        "released": g.metrics[0].released_bytes >> 20, "rss": g.metrics[-1].rss_bytes >> 20}))
'''
model = sys.argv[1]
for ctx, ub in ((256, 64), (2304, 64), (2304, 512)):
    cap = ramcap.make_cap(1107 * 2**20, "auto")
    cap.prepare()
    p = subprocess.run([sys.executable, "-c", code, model, str(ctx), str(ub)], capture_output=True, text=True, preexec_fn=cap.preexec)
    cap.finish()
    print(p.stdout.strip() or p.stderr[-500:])
