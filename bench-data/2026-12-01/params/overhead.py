"""What the new sampling parameters cost per token, as ratios within one run: the same greedy generation
(the tiny qwen3moe fixture, 1 thread) with nothing asked, with logprobs (0, 5, 20 alternatives), with a
logit bias, and with the penalties; the cells interleaved, six rounds, medians of the decode tok/s (the engine's
step times: sampling and the logprobs included) and of the whole loop's (Python's copies of them too).

    .venv/bin/python bench-data/2026-12-01/params/overhead.py > bench-data/2026-12-01/params/overhead.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from bmoe_edge.engine.session import Engine, Sampling
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.synthetic import tinymoe

CELLS = {
    "plain": Sampling(temp=0.0),
    "logprobs-0": Sampling(temp=0.0, logprobs=0),
    "logprobs-5": Sampling(temp=0.0, logprobs=5),
    "logprobs-20": Sampling(temp=0.0, logprobs=20),
    "logit-bias": Sampling(temp=0.0, logit_bias="11:-100,12:5"),
    "penalties": Sampling(temp=0.0, presence_penalty=0.5, frequency_penalty=0.5, repeat_penalty=1.1),
}
ROUNDS, TOKENS = 6, 200


def main() -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    rates: dict[str, list[float]] = {name: [] for name in CELLS}
    walls: dict[str, list[float]] = {name: [] for name in CELLS}
    with Engine(model, StreamConfig(threads=1, ctx=512)) as e:
        ids = e.tokenize("Once upon a time there was a fox")
        e.run(ids, 8, Sampling(temp=0.0))   # warm
        for r in range(ROUNDS):
            for name, sampling in CELLS.items():
                t0 = time.perf_counter()
                gen = e.run(ids, TOKENS, sampling)
                wall = time.perf_counter() - t0
                decode_ms = sum(m.wall_ms for m in gen.metrics[1:])
                rate = 1000 * (len(gen.metrics) - 1) / decode_ms
                rates[name].append(rate)
                walls[name].append(len(gen.tokens) / wall)
                print(json.dumps({"round": r, "cell": name, "tokens": len(gen.tokens), "wall_s": round(wall, 4),
                                  "decode_tok_s": round(rate, 1)}))
    base, base_wall = statistics.median(rates["plain"]), statistics.median(walls["plain"])
    for name, values in rates.items():
        med, wall = statistics.median(values), statistics.median(walls[name])
        print(json.dumps({"summary": name, "median_decode_tok_s": round(med, 1), "decode_ratio": round(med / base, 3),
                          "median_wall_tok_s": round(wall, 1), "wall_ratio": round(wall / base_wall, 3)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
