"""Does a rest make the next runs faster? rounds of: [sleep S | busy], then 6 warm runs; per-run tok/s."""
import os, sys, time
from pathlib import Path
from bmoe_edge.engine import Engine
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "host-not-compaction" / "scripts"))
from full_cache import config  # session 26's engine settings, shared, not copied
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); rounds = int(sys.argv[3]); rest = float(sys.argv[4])
def ts(g):
    d = g.metrics[1:]; return 1000 * len(d) / sum(m.wall_ms for m in d)
with Engine(model, config(model, t)) as e:
    e.run(PROMPT, WARMUP_TOKENS)
    for r in range(rounds):
        mode = "rest" if r % 2 == 0 else "busy"
        t0 = time.monotonic()
        while time.monotonic() - t0 < rest:
            if mode == "rest": time.sleep(rest)
            else: e.run(PROMPT, 65)
        v = [ts(e.run(PROMPT, 65)) for _ in range(6)]
        print(r, mode, " ".join(f"{x:.1f}" for x in v), flush=True)
