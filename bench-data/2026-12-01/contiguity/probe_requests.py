"""Disk requests per decode step (/sys/block/vda/stat) beside the engine's own counters. Run it
inside the cap, e.g. as the child of the A/B harness's cgroup:

    python probe_requests.py MODEL '{"cache_mb": "auto"}' TOKENS
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "quiet-defaults" / "profile"))
import ab

from bmoe_edge.engine import Engine, StreamConfig


def disk() -> tuple[int, int]:
    fields = Path("/sys/block/vda/stat").read_text().split()
    return int(fields[0]), int(fields[2])  # reads completed, sectors read


def main(model: str, extra: dict, tokens: int) -> None:
    before = disk()
    with Engine(model, StreamConfig(**{**ab.BASE, **extra})) as engine:
        now = disk()
        print("load", now[0] - before[0], "requests", (now[1] - before[1]) >> 11, "MiB")
        before = now
        for i, token in enumerate(engine.generate("Once upon a time", max_tokens=tokens)):
            now = disk()
            requests, sectors = now[0] - before[0], now[1] - before[1]
            m = token.metrics
            print(i, f"wall {m.wall_ms:6.0f} io {m.io_ms:5.0f} MiB {m.bytes_read / 2**20:5.0f} requests {requests} "
                  f"KiB/request {sectors / 2 / max(1, requests):.0f}", flush=True)
            before = now


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
