"""An engine decoding warm runs of 64 tokens for SECONDS (prints READY once warm, then each run's tok/s): the process
scripts/perf.sh samples. python loop.py MODEL stream|resident SECONDS (two threads, full_cache.config)"""
import os, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "host-not-compaction" / "scripts"))
from full_cache import config  # session 26's engine settings, shared, not copied
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
from bmoe_edge.engine import Engine, report
model = Path(os.path.expanduser(sys.argv[1])); mode = sys.argv[2]; secs = float(sys.argv[3])
with Engine(model, config(model, 2, ctx=128, mode=mode)) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    print("READY", flush=True)
    t0 = time.monotonic(); out = []
    while time.monotonic() - t0 < secs:
        g = e.run(PROMPT, 65)
        out.append(float(report.summary(g, e.run_info)["decode_tok_s"]))
    print(" ".join(f"{x:.1f}" for x in out), flush=True)
