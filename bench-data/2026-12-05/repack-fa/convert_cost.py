"""What converting a slice into the repacked layout costs the read lanes, per MB, against what reading a MB
takes at each storage class of the profiles (issue 47: convert on read, or a prepared pre-repacked copy).
`--repack all`, no cache (every routed slice read and converted every token), one compute thread, 4 lanes.

    python convert_cost.py MODEL TOKENS
"""
import sys

from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine
from bmoe_edge.engine.settings import StreamConfig

model, tokens = sys.argv[1], int(sys.argv[2])
with Engine(model, StreamConfig(threads=1, cache_mb=0.0, repack="all", prefetch="off")) as e:
    g = e.run("Once upon a time in a small village by the sea", tokens)
    decodes = g.metrics[1:]
    converted_mb = sum(m.copy_bytes for m in decodes) / 1e6
    convert_ms = sum(m.convert_ms for m in decodes)
    print(f"{e.run_info['repack_layouts']}: {converted_mb:.0f} MB through the lanes' buffers in {convert_ms:.0f} ms "
          f"of lane time converting: {convert_ms / converted_mb:.3f} ms/MB ({converted_mb / convert_ms * 1000:.0f} MB/s of one lane's time)")
for name, c in sorted(profiles.storage_classes().items(), key=lambda kv: kv[1].read_mb_s):
    print(f"  {name}: reading a MB takes {1000 / c.read_mb_s:.2f} ms ({c.read_mb_s:g} MB/s)")
