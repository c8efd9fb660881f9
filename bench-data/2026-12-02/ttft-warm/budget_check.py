"""The cache budget a short prompt's decode gets under the 40% cap, ubatch 512 (the table's) against the context's
2,048 (fit_to_conversation), ctx 2048, one process each."""
import json, os, sys
from bmoe_edge.bench import ramcap
from bmoe_edge.engine import Engine, StreamConfig
from bmoe_edge.engine.settings import StreamConfig as SC
model, ub = sys.argv[1], int(sys.argv[2])
cg = ramcap.memory_cgroup_v1() / f"bc-{os.getpid()}"
cg.mkdir()
(cg / "memory.limit_in_bytes").write_text(str(1107 << 20))
(cg / "cgroup.procs").write_text(str(os.getpid()))
cfg = StreamConfig(ctx=2048, batch=ub, ubatch=ub)
with Engine(model, cfg) as e:
    r = e.run("Once upon a time there was a harbour.", 24)
    ms = r.metrics
    print(json.dumps({"ubatch": ub, "budget_mib_first": ms[0].cache_budget_bytes >> 20, "budget_mib_last": ms[-1].cache_budget_bytes >> 20,
                      "tok_s": round(len(ms[1:]) / (sum(m.wall_ms for m in ms[1:]) / 1000), 2),
                      "hits": round(sum(m.cache_hits for m in ms[1:]) / max(1, sum(m.cache_lookups for m in ms[1:])), 3)}))
