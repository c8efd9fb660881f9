import math, os, sys, statistics as st
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench import llama_bench
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS, _prompt_ids
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2])
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
def eng(**kw):
    return replace(base, threads=t, repack="auto", ctx=768, flash_attn=False, **kw)
res = {}
for rep in range(2):
    for name, cfg in (("stream-whole", eng(cache_mb=float(full_mb))), ("resident", eng(stream=False))):
        if False: pass
        else: os.environ.pop("BMOE_NOSPLIT", None)
        with Engine(model, cfg) as e:
            e.run(PROMPT, WARMUP_TOKENS); e.run(_prompt_ids(e.tokenize, 512, -1), 1)
            for r in range(3):
                res.setdefault(name, []).append(float(report.summary(e.run(PROMPT, 33), e.run_info)["decode_tok_s"]))
    res.setdefault("llama-bench", []).append(llama_bench.run(model, threads=t, decode_tokens=32, prompt_tokens=0, flash_attn="off")["decode_tok_s"])
    print({k: [round(x, 2) for x in v] for k, v in res.items()}, flush=True)
print({k: round(st.median(v), 2) for k, v in res.items()})
