"""Physically consecutive runs of the memfd pool's pages after a run (the pool before 2026-12-01,
whose mappings were named `bmoe-expert-pages`). Needs root for page frame numbers.

    python probe_pagemap_memfd.py MODEL '{"cache_mb": "auto"}' TOKENS
"""

import json
import struct
import sys
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "quiet-defaults" / "profile"))
import ab

from bmoe_edge.engine import Engine, StreamConfig

PFN = (1 << 55) - 1


def pool_runs() -> tuple[int, int]:
    pages = runs = 0
    with open("/proc/self/pagemap", "rb") as pagemap:
        for line in Path("/proc/self/maps").read_text().splitlines():
            if "bmoe-expert-pages" not in line:
                continue
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            n = (hi - lo) // 4096
            pagemap.seek(lo // 4096 * 8)
            frames = [v & PFN for v in struct.unpack(f"<{n}Q", pagemap.read(8 * n))]
            pages += n
            runs += 1 + sum(1 for a, b in pairwise(frames) if b != a + 1)
    return pages, runs


def main(model: str, extra: dict, tokens: int) -> None:
    with Engine(model, StreamConfig(**{**ab.BASE, **extra})) as engine:
        io = sum(t.metrics.io_ms for i, t in enumerate(engine.generate("Once upon a time", max_tokens=tokens)) if i)
        pages, runs = pool_runs()
        print(extra, f"io/token {io / (tokens - 1):.0f} ms; pool pages {pages}, runs {runs}, "
              f"pages/run {pages / max(runs, 1):.1f}")


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
