import math, os, sys, time
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, info, report, settings
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); stream = sys.argv[3] == "stream"
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
cfg = replace(base, threads=t, repack="auto", ctx=int(os.environ.get("CTX", "768")), flash_attn=False, cache_mb=float(full_mb)) if stream else replace(base, threads=t, repack="auto", ctx=int(os.environ.get("CTX", "768")), flash_attn=False, stream=False)
with Engine(model, cfg) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    open("/tmp/diag/ready", "w").write(str(os.getpid()))
    for _ in range(int(sys.argv[4])):
        g = e.run(PROMPT, 129)
        print(round(report.summary(g, e.run_info)["decode_tok_s"], 2), flush=True)
