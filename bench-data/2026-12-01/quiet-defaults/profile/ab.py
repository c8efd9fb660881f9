"""The A/B harness of ../findings.md: engine configs run one after another, each a fresh process in a
cgroup at the cap after dropping the model's page cache; prints tok/s, I/O and stall per token, rusage
from the first generate call, the cgroup's failcnt and the /proc/vmstat counters that moved.

    .venv/bin/python bench-data/2026-12-01/quiet-defaults/profile/ab.py MODEL CAP_MIB TOKENS REPEATS \
        '{"cache_mb": "auto"}' '{"cache_mb": 600}'

Each JSON argument is laid over the bench cells' `*-overlap-od4` config (ctx 256, batch 64, 1 thread,
4 O_DIRECT lanes, overlap, read-ahead off). `perf record` was run around the child by hand.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

BASE = {"threads": 1, "ctx": 256, "batch": 64, "ubatch": 64, "stream": True, "io_threads": 4,
        "read_path": "odirect", "overlap": True, "prefetch": "off"}
VMSTAT_KEYS = ("allocstall", "pgscan_direct", "pgsteal_direct", "throttle", "workingset_refault", "pgmajfault")


def child(model: str, config: dict, tokens: int) -> None:
    from bmoe_edge.engine import Engine, StreamConfig

    with Engine(model, StreamConfig(**config)) as engine:
        io = stall = 0.0
        read = 0
        start = time.monotonic()
        before = resource.getrusage(resource.RUSAGE_SELF)
        for i, token in enumerate(engine.generate("Once upon a time", max_tokens=tokens)):
            if i == 0:  # decode speed from here, like bench's cells (the prompt step reads a cold model)
                decode_start = time.monotonic()
            else:
                io += token.metrics.io_ms
                stall += token.metrics.stall_ms
                read += token.metrics.bytes_read
        seconds = time.monotonic() - start
        decode_seconds = time.monotonic() - decode_start
        after = resource.getrusage(resource.RUSAGE_SELF)
        steps = tokens - 1
        print(json.dumps({
            "budget_mb": round(engine.run_info["cache_budget_mb"]), "tok_s": round(tokens / seconds, 3),
            "decode_tok_s": round((tokens - 1) / decode_seconds, 3),
            "io_ms": round(io / steps, 1), "stall_ms": round(stall / steps, 1),
            "MiB_tok": round(read / steps / 2**20, 1),
            "sys_s": round(after.ru_stime - before.ru_stime, 2), "user_s": round(after.ru_utime - before.ru_utime, 2),
            "majflt": after.ru_majflt - before.ru_majflt, "minflt": after.ru_minflt - before.ru_minflt}))


def vmstat() -> dict[str, int]:
    return {name: int(value) for name, value in (line.split() for line in open("/proc/vmstat"))}


def main(model: str, cap_mib: int, tokens: int, repeats: int, configs: list[str]) -> None:
    from bmoe_edge.bench import ramcap
    from bmoe_edge.bench.machine import drop_page_cache

    for repeat in range(repeats):
        for extra in configs:
            config = {**BASE, **json.loads(extra)}
            drop_page_cache(Path(model))
            cap = ramcap.make_cap(cap_mib << 20)
            cap.prepare()
            before = vmstat()
            run = subprocess.run([sys.executable, __file__, "--child", model, json.dumps(config), str(tokens)],
                                 capture_output=True, text=True, preexec_fn=cap.preexec)
            after = vmstat()
            result = cap.finish()
            moved = {k: after[k] - before.get(k, 0) for k in after
                     if any(key in k for key in VMSTAT_KEYS) and after[k] != before.get(k, 0)}
            print(repeat, extra, run.stdout.strip() or run.stderr[-400:], "failcnt", result.failcnt, moved, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))
    else:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
