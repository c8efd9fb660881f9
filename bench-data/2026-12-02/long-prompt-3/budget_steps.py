"""Issue 29: what the memory budget reads at each step after a prompt of N tokens (the long-prompt cells'
settings, 40% cap = 1107 MiB, cgroup v1): the cgroup's usage and file pages, our mapped file pages, the
budget. Why a 2,048-token prompt leaves the decode's budget ~37 MiB below a 16-token one's.

    .venv/bin/python bench-data/2026-12-02/long-prompt-3/budget_steps.py MODEL.gguf N [TOKENS]
"""
import os
import sys
from pathlib import Path

from bmoe_edge.bench.machine import long_prompt
from bmoe_edge.cli.bench import _long_prompt_configs

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # bench-data/
import campaign  # noqa: E402

model, n = sys.argv[1], int(sys.argv[2])
tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 32
Path("/proc/sys/vm/drop_caches").write_text("3\n")   # every run starts with the same (empty) page cache
cg, _ = campaign.join_cap("diag", cap_mib=1107)
from bmoe_edge.engine import Engine, Generation, StreamConfig  # noqa: E402  (after joining the cgroup)


def reading() -> str:
    st = dict(line.split() for line in (cg / "memory.stat").read_text().splitlines())
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    kb = {k: int(status[k].split()[0]) >> 10 for k in ("RssAnon", "RssFile", "RssShmem")}
    usage = int((cg / "memory.usage_in_bytes").read_text()) >> 20
    kmem = int((cg / "memory.kmem.usage_in_bytes").read_text()) >> 20
    return (f"usage={usage} kmem={kmem} rss={int(st['rss']) >> 20} active_file={int(st['active_file']) >> 20} "
            f"inactive_file={int(st['inactive_file']) >> 20} mapped_file={int(st['mapped_file']) >> 20} "
            f"shmem={int(st['shmem']) >> 20} "
            f"unmapped_anon={(int(st['active_anon']) + int(st['inactive_anon']) - int(st['rss']) - int(st['shmem'])) >> 20} | RssAnon={kb['RssAnon']} RssFile={kb['RssFile']} RssShmem={kb['RssShmem']}")


config = _long_prompt_configs(16, None, [2048])[2048]
with Engine(model, StreamConfig(**config)) as e:
    print("open:", reading(), flush=True)
    gen = Generation([])
    for i, t in enumerate(e.generate(long_prompt(e.tokenize, n), tokens, result=gen)):
        m = t.metrics
        if i == tokens - 1:
            print((cg / "memory.stat").read_text(), flush=True)
        print(f"{i:3d} budget={m.cache_budget_bytes >> 20} experts={m.resident_expert_bytes >> 20} "
              f"released={m.released_bytes >> 20} faults={m.major_faults} | {reading()}", flush=True)
cg.rmdir() if not (cg / "cgroup.procs").read_text().strip() else None
