"""The whole-graph gate cases on an emulated board's own build (qemu-aarch64 with the board's CPU), every weight
type of the matrix on qwen3moe and gemma4: bench-data/2026-12-05/repack/gates/arm_types.py with only these cases.

    .venv/bin/python bench-data/2026-12-05/whole-graph/arm_whole.py qemu-arm64 > arm-qemu-arm64.json
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "repack" / "gates"))
import arm_types  # noqa: E402

arm_types.CASES = ()
if __name__ == "__main__":
    raise SystemExit(arm_types.main(sys.argv[1], ("whole-graph", "whole-graph-2-threads")))
