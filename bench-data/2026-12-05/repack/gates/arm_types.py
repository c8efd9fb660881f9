"""The repacked kernels' ARM layouts, gated beyond the quick matrix: every weight type of the gate matrix (its
QUANTS and its type column) on qwen3moe (split gate/up/down) and gemma4 (fused gate_up), in the column's case
(cache-small), with overlap, and with --repack off, on an emulated board's own build (qemu-aarch64 with the
board's CPU: cortex-a76 for dotprod layouts, `max` for i8mm ones).

    .venv/bin/python bench-data/2026-12-05/repack/gates/arm_types.py qemu-arm64 > arm-qemu-arm64.json
    .venv/bin/python bench-data/2026-12-05/repack/gates/arm_types.py qemu-arm64-i8mm > arm-qemu-arm64-i8mm.json

A second argument adds cases (comma list): bench-data/2026-12-05/repack-fa/gates/ ran `... BOARD flash-attn-off`
once flash attention was on in every other case.

The fixtures are made (or found) here, on the host, and linked under the names a bundle's fixtures/ has; the
board's Python runs gates.run_gates on them under qemu and prints the records as JSON.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from bmoe_edge.boards import emulate
from bmoe_edge.proof import gates
from bmoe_edge.synthetic.specs import FixtureSpec, host_fixture_paths

ARCHS = ("qwen3moe", "gemma4")
CASES = ("cache-small", "overlap-cache-small", "repack-off")

ON_THE_BOARD = """
import json, sys
from pathlib import Path
from bmoe_edge.proof import gates
from bmoe_edge.synthetic.specs import FixtureSpec, fixture_resolver
wanted = json.loads(sys.argv[1])
cells = [gates.GateCell(FixtureSpec(a, q), gates.CASES[c]) for a, q, c in wanted["cells"]]
results = [gates.as_record(r) for r in gates.run_gates(cells, fixture_resolver(Path(wanted["fixtures"])))]
print(json.dumps({"passed": sum(r["passed"] for r in results), "failed": sum(not r["passed"] for r in results),
                  "cells": results}))
"""


def main(board: str, more_cases: tuple[str, ...] = ()) -> int:
    quants = dict.fromkeys((*gates.QUANTS, *gates.TYPE_COLUMN_QUANTS))
    cells = [(arch, quant, case) for arch in ARCHS for quant in quants for case in (*CASES, *more_cases)]
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            for quant in quants:
                spec = FixtureSpec(arch, quant)
                (Path(tmp) / spec.filenames[0]).symlink_to(host_fixture_paths(spec)[0])
        wanted = json.dumps({"cells": cells, "fixtures": tmp})
        result = emulate.run_bundle(Path("dist") / board, ["-c", ON_THE_BOARD, wanted], module=False, capture=True)
    if result.returncode != 0:
        print(result.stderr[-2000:], file=sys.stderr)
        return 1
    print(result.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ()))
