import math, os, sys, statistics as st, time, json
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench import llama_bench
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS, _prompt_ids
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); reps = int(sys.argv[3])
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=768, flash_attn=False, cache_mb=float(full_mb))
out = []
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS); e.run(_prompt_ids(e.tokenize, 512, -1), 1)
    for r in range(reps):
        order = ("e", "lb") if r % 2 == 0 else ("lb", "e")
        rec = {"r": r}
        for w in order:
            if w == "e":
                g = e.run(PROMPT, 33)
                ms = [m.wall_ms for m in g.metrics[1:]]
                rec["e_tok_s"] = 1000 * len(ms) / sum(ms)
                rec["e_ms"] = [round(x, 2) for x in ms]
                rec["e_stall"] = sum(m.stall_ms for m in g.metrics[1:]); rec["e_read"] = sum(m.bytes_read for m in g.metrics[1:])
                rec["e_whole"] = sum(m.whole_graphs for m in g.metrics[1:]); rec["e_majflt"] = sum(m.major_faults for m in g.metrics[1:])
                t0 = time.perf_counter(); e.run(_prompt_ids(e.tokenize, 512, r), 1); rec["prompt_s"] = time.perf_counter() - t0
            else:
                rec["lb"] = llama_bench.run(model, threads=t, decode_tokens=32, prompt_tokens=0, flash_attn="off")["decode_tok_s"]
        rec["first"] = order[0]
        print(json.dumps(rec), flush=True); out.append(rec)
print("ratio med", st.median(r["e_tok_s"] / r["lb"] for r in out))
