"""Issue 29: memory after a prompt of N tokens (the long-prompt cells' settings) under a 1107 MiB cgroup v1 cap:
the cgroup's memory.stat, the largest resident mappings, smaps_rollup. What found the 96 MiB work buffer.

    .venv/bin/python bench-data/2026-12-02/long-prompt-2/mem_after_prompt.py MODEL.gguf 2048
"""
import os, sys, time
from pathlib import Path
from bmoe_edge.cli.bench import _long_prompt_configs
from bmoe_edge.bench.machine import long_prompt
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # bench-data/
import campaign

n = int(sys.argv[2]); model = sys.argv[1]
cg, _ = campaign.join_cap("diag", cap_mib=1107)
from bmoe_edge.engine import Engine, Generation, StreamConfig
config = _long_prompt_configs(16, None, [2048])[2048]
print(config)
def stat():
    d = dict(l.split() for l in (cg / "memory.stat").read_text().splitlines())
    keys = ["rss", "cache", "shmem", "mapped_file", "active_anon", "inactive_anon", "active_file", "inactive_file"]
    return " ".join(f"{k}={int(d[k])>>20}" for k in keys) + f" usage={int((cg/'memory.usage_in_bytes').read_text())>>20}"
with Engine(model, StreamConfig(**config)) as e:
    print("open:", stat())
    prompt = long_prompt(e.tokenize, n)
    gen = Generation([])
    for i, t in enumerate(e.generate(prompt, 16, result=gen)):
        if i in (0, 1, 15):
            m = t.metrics
            print(i, "budget", m.cache_budget_bytes >> 20, "resident_exp", m.resident_expert_bytes >> 20, "rss", m.rss_bytes >> 20, "released", m.released_bytes >> 20, "|", stat())
    big = []
    cur = None
    for line in open("/proc/self/smaps"):
        if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
            cur = line.strip()
        elif line.startswith("Rss:"):
            kb = int(line.split()[1])
            if kb > 8192:
                big.append((kb, cur))
    for kb, name in sorted(big, reverse=True)[:14]:
        print(f"{kb>>10:6d} MiB  {name[:110]}")
    print(open("/proc/self/smaps_rollup").read())
