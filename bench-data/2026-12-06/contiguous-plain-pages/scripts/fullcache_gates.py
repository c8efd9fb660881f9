"""The gate cells whose cache holds every expert (the pool's plain-page path), over every architecture of the depth matrix."""
from bmoe_edge.proof import gates
names = ("cache-large", "cache-auto", "repack-auto-cache-large", "whole-graph", "whole-graph-2-threads")
cells = [c for c in gates.full_matrix() if c.case.name in names and c.fixture.split == 1]
print(len(cells), "cells", flush=True)
failed = 0
for r in gates.run_gates(cells, gates.fixture_resolver(None), gates.STEPS):
    line = gates.format_result(r)
    failed += not line.startswith("PASS")
    print(line, flush=True)
print("failed", failed)
