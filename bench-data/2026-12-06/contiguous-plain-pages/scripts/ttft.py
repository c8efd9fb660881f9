"""A cold engine's first 512-token prompt, uncapped, the machine's defaults at 2 threads: python ttft.py MODEL"""
import os, sys, time
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, report, settings
from bmoe_edge.bench.kernels import _prompt_ids
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
cfg = replace(base, threads=2, ctx=1024)
t0 = time.monotonic()
with Engine(Path(sys.argv[1]), cfg) as e:
    t1 = time.monotonic()
    ids = _prompt_ids(e.tokenize, 512, -1)
    g = e.run(ids, 1)
    s = report.summary(g, e.run_info)
    print(os.environ.get("BMOE_DIAG_OLD_POOL") and "old" or "new", "open_s", round(t1 - t0, 2), "ttft_ms", round(s["ttft_ms"]),
          "prompt_ms", round(s["prompt_ms"]), "budget_mb", round(e.run_info["cache_budget_mb"]), "bytes_read_mb", round(g.metrics[0].bytes_read / 2**20), flush=True)
