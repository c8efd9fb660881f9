import sys, time, statistics
from pathlib import Path
from bmoe_edge.engine import Engine
from bmoe_edge.engine.settings import StreamConfig
M = Path.home() / ".cache/bmoe-edge/bench/tune-qwen3-30b-a3b-3g-2l-Q4_0.gguf"
from dataclasses import replace
cfg = replace(StreamConfig(), threads=1, ctx=1024)
with Engine(M, cfg) as e:
    e.run("Once upon a time", 32)
    t0 = time.perf_counter(); g = e.run("Once upon a time", 256); dt = time.perf_counter() - t0
    w = [m.wall_ms for m in g.metrics[1:]]
    print(sys.argv[1], "python s/token %.3f ms" % (1000 * dt / len(g.metrics)), "native wall_ms mean %.3f median %.3f" % (statistics.mean(w), statistics.median(w)))
