"""Resident vs full cache in one process, token by token; then where each engine's pages physically are.

Usage (root: /proc/kpageflags): .venv/bin/python probe_layout.py MODEL.gguf [TOKENS]
"file" is the resident engine's mapping of the model (llama.cpp mmap), "anon" the full cache's mirror
units. compound = the page is part of a large folio, thp = of a PMD-size one (sampled 1 in 64).
"""

import statistics
import struct
import sys
from pathlib import Path

from bmoe_edge.engine import Engine, StreamConfig

PAGE = 4096
KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL, KPF_THP = 1 << 15, 1 << 16, 1 << 22
PROMPT = "The history of the printing press"


def frames(start: int, end: int) -> list[int | None]:
    n = (end - start) // PAGE
    with open("/proc/self/pagemap", "rb", buffering=0) as pm:
        pm.seek(start // PAGE * 8)
        entries = struct.unpack(f"{n}Q", pm.read(n * 8))
    return [e & ((1 << 55) - 1) if e >> 63 else None for e in entries]


def layout(pfns: list[int | None]) -> tuple[int, int, int, int]:
    """(present pages, runs of consecutive frames, sampled pages in large folios, sampled in THPs)"""
    present = [p for p in pfns if p]
    runs, prev = 0, None
    for p in pfns:
        runs += p is not None and (prev is None or p != prev + 1)
        prev = p
    compound = thp = 0
    with open("/proc/kpageflags", "rb", buffering=0) as kf:
        for p in present[::64]:
            kf.seek(p * 8)
            flags = struct.unpack("Q", kf.read(8))[0]
            compound += bool(flags & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL))
            thp += bool(flags & KPF_THP)
    return len(present), runs, compound, thp


def paired_ratio(resident: Engine, streamed: Engine, tokens: int) -> float:
    steps = (streamed.generate(PROMPT, tokens), resident.generate(PROMPT, tokens))
    ratios = []
    for i in range(tokens):
        taken = {k: next(steps[k], None) for k in ((0, 1) if i % 2 == 0 else (1, 0))}
        if taken[0] is None or taken[1] is None:
            break
        if taken[0].metrics.step > 0:
            ratios.append(taken[1].metrics.wall_ms / taken[0].metrics.wall_ms)
    for step in steps:
        step.close()
    return statistics.median(ratios)


def main() -> None:
    model = sys.argv[1]
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    base = {"threads": 1, "ctx": 512, "batch": 64, "ubatch": 64}
    full = dict(base, stream=True, io_threads=4, read_path="odirect", overlap=True, prefetch="off", cache_mb=3100)
    with Engine(model, StreamConfig(**dict(base, stream=False))) as resident, \
            Engine(model, StreamConfig(**full)) as streamed:
        resident.run(PROMPT, tokens)
        streamed.run(PROMPT, tokens)
        print(f"ratio median {paired_ratio(resident, streamed, tokens):.3f}")
        totals: dict[str, list[int]] = {}
        for line in Path("/proc/self/maps").read_text().splitlines():
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            kind = "anon" if len(parts) <= 5 else "file" if parts[5].endswith(".gguf") else ""
            if not kind or end - start < 16 * PAGE:
                continue
            stats = layout(frames(start, end))
            if stats[0]:
                total = totals.setdefault(kind, [0, 0, 0, 0, 0])
                for i, v in enumerate((*stats, 1)):
                    total[i] += v
        for kind, (present, runs, compound, thp, vmas) in totals.items():
            sampled = max(1, (present + 63) // 64)
            print(f"{kind}: {vmas} vmas, present {present * PAGE >> 20} MiB, mean run {present / runs:.1f} pages, "
                  f"compound {compound / sampled:.2f}, thp {thp / sampled:.2f}")
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.split(":")[0] in ("Rss", "AnonHugePages", "FilePmdMapped"):
                print(line)


if __name__ == "__main__":
    main()
