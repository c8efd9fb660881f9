"""The A/B with the LRU twin first (serve/ ran every frequency cell before its twin: a host-side cache of the
drive's blocks would favour the second): skewed preset, p1-c1 and p4-c4, 2 repeats, 40% cap, one thread."""
import sys
from pathlib import Path

from bmoe_edge.bench import serve_bench as sb

model, out = Path(sys.argv[1]), Path(sys.argv[2])
cells = [c for c in sb.with_ab(sb.default_cells([1, 4], 0, 128), *sb.CACHE_AB) if c.label.startswith(("p1-c1", "p4-c4"))]
lru_first = [cells[1], cells[0], cells[3], cells[2]]
sb.campaign({model.stem: model}, out, lru_first, cap="40%", cap_method="auto", tokens=32, repeats=2, threads=1,
            ctx=512)
