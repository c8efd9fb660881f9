"""Side by side: decode tok/s cache-off with and without --verify-slices on the bench preset."""
import sys
from dataclasses import replace
from pathlib import Path

from bmoe_edge.engine import Engine, StreamConfig

model = Path(sys.argv[1])
tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 24
base = StreamConfig(threads=1, ctx=256, batch=64, ubatch=64, cache_mb=0, io_threads=4, read_path="odirect",
                    overlap=True)
rates = {False: [], True: []}
for rep in range(2):
    for verify in ((False, True) if rep % 2 == 0 else (True, False)):
        with Engine(model, replace(base, verify_slices=verify)) as e:
            g = e.run("Once upon a time", tokens)
            dec = g.metrics[1:]
            rate = len(dec) / (sum(m.wall_ms for m in dec) / 1000)
            rates[verify].append(rate)
            print(f"rep {rep} verify={verify}: {rate:.2f} tok/s, rereads {sum(m.rereads for m in g.metrics)}",
                  flush=True)
off, on = sum(rates[False]) / len(rates[False]), sum(rates[True]) / len(rates[True])
print(f"mean: off {off:.2f} tok/s, verify {on:.2f} tok/s, cost {100 * (1 - on / off):.1f}%")
