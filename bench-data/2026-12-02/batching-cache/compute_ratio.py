"""Compute alone: one sequence vs 4 decoding together, the model resident (llama.cpp's mmap, no streaming, the
file in the page cache: no expert reads), one thread, interleaved `repeats` times. What batching can buy
where reads cost nothing: the ceiling the I/O saving multiplies into.

    python compute_ratio.py MODEL TOKENS REPEATS
"""
import json
import sys
import time

from bmoe_edge.bench.serve_bench import PROMPTS
from bmoe_edge.engine import Engine
from bmoe_edge.engine.batching import generate_together
from bmoe_edge.engine.settings import StreamConfig

model, tokens, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with Engine(model, StreamConfig(stream=False, threads=1, ctx=512, parallel=4)) as e:
    prompts = [e.tokenize(p) for p in PROMPTS[:4]]
    generate_together(e, prompts, 4)  # the file's pages in
    for r in range(repeats):
        for n in (1, 4):
            steps = []
            t0 = time.perf_counter()
            gens = generate_together(e, prompts[:n], tokens, steps=steps)
            wall = time.perf_counter() - t0
            dec = [s for s in steps if s.n_decoding == s.n_sequences and s.n_tokens == n]
            print(json.dumps({"repeat": r, "sequences": n, "tok_s": sum(len(g.tokens) for g in gens) / wall,
                              "decode_ms_per_step": sum(s.wall_ms for s in dec) / max(1, len(dec)),
                              "steps": len(dec)}), flush=True)
