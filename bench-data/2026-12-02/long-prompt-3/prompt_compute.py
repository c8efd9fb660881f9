"""Issue 29: is a streamed 512-token prompt slower than the resident one in its reads or in its compute?
One process per engine, uncapped (the cache holds every expert): streamed, a prompt A (reads its experts)
then a different prompt B of the same length (every expert cached: no reads); resident, the same A then B.
Prints each prompt's time (the first step's wall time), bytes read and threads.

    .venv/bin/python bench-data/2026-12-02/long-prompt-3/prompt_compute.py MODEL.gguf [N] [REPEATS]
"""
import json
import subprocess
import sys

def shootdowns() -> int:
    """TLB shootdown interrupts received, all CPUs (/proc/interrupts' TLB line)."""
    for line in open("/proc/interrupts"):
        if line.strip().startswith("TLB:"):
            return sum(int(x) for x in line.split()[1:] if x.isdigit())
    return 0


def context_switches() -> int:
    """Voluntary and involuntary context switches of every thread of this process."""
    import glob
    total = 0
    for status in glob.glob("/proc/self/task/*/status"):
        for line in open(status):
            if "ctxt_switches" in line:
                total += int(line.split()[1])
    return total


if len(sys.argv) > 3 and sys.argv[3] == "--one":
    from bmoe_edge.bench.machine import long_prompt
    from bmoe_edge.cli.bench import _long_prompt_configs
    from bmoe_edge.engine import Engine, Generation, StreamConfig

    model, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[4]
    import os
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # bench-data/
    import campaign
    # CAP_MIB: the long-prompt cells' cap (1107 MiB for the 3 GB presets); BPS: the storage class's read
    # throttle (blkio v1, as --storage) of the disk DEV
    campaign.join_cap("pc", cap_mib=int(os.environ.get("CAP_MIB") or 0), read_bps=int(os.environ.get("BPS") or 0),
                      device=os.environ.get("DEV", "254:0"))
    config = _long_prompt_configs(16, None, [n])[n]
    config["stream"] = kind == "stream"
    with Engine(model, StreamConfig(**config)) as e:
        a = long_prompt(e.tokenize, n)
        b = [a[0]] + a[1:][::-1]     # the same tokens in another order: another prompt, no reusable prefix
        if os.environ.get("WARM"):   # as serve does between requests: the pool's pages faulted in first
            import time
            t = time.perf_counter()
            while e.warm_cache_memory(32 << 20):
                pass
            print(f"warm {time.perf_counter() - t:.2f} s", file=sys.stderr)
        for name, prompt in (("A", a), ("B", b)):
            gen = Generation([])
            tlb0, switches0 = shootdowns(), context_switches()
            first = next(iter(e.generate(prompt, 1, result=gen)))
            tlb, switches = shootdowns() - tlb0, context_switches() - switches0
            m = first.metrics
            print(json.dumps({"kind": kind, "cap_mib": os.environ.get("CAP_MIB", ""), "bps": os.environ.get("BPS", ""), "prompt": name, "n": n, "ms": round(m.wall_ms, 1),
                              "compute_ms": round(m.compute_ms, 1), "stall_ms": round(m.stall_ms, 1),
                              "read_mb": round(m.bytes_read / 1e6, 1), "hits": m.cache_hits,
                              "lookups": m.cache_lookups, "tlb_shootdowns": tlb,
                              "context_switches": switches}), flush=True)
    sys.exit(0)

model = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 512
repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 2
for r in range(repeats):
    for kind in ("stream", "resident") if r % 2 == 0 else ("resident", "stream"):
        subprocess.run([sys.executable, __file__, model, str(n), "--one", kind], check=True)
