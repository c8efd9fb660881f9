import sys, time
from bmoe_edge.engine import native
n = native.load(); c = n.StreamConfig(); c.cache_mb = 700; c.threads = 2
e = n.Engine("/root/.cache/bmoe-edge/bench/qwen3-30b-a3b-3g-Q4_0-skew0.gguf", c)
e.begin(e.tokenize("Once upon a time " * 40, True), n.SamplingParams(), False)
r = n.StepResult(); k=0; ws=0
while k < 80 and e.next(r):
    k+=1
    if k > 16: ws += r.metrics.wall_ms
print("RESULT", sys.argv[1], round(64/(ws/1000), 3), file=sys.stderr)
