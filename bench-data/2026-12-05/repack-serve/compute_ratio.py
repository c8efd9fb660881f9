"""Compute alone, on each kernel setting: one sequence vs 4 decoding together, the model resident (no
streaming, the file in the page cache: no expert reads), interleaved `repeats` times. Issue 47's question of
2026-12-02's batching-cache/compute_ratio.py: does a 4-sequence step cost less than 4 one-sequence steps once
llama.cpp's repacked kernels compute the experts?

    python compute_ratio.py MODEL TOKENS REPEATS THREADS > compute-ratio.jsonl
"""
import json
import sys
import time

from bmoe_edge.bench.serve_bench import PROMPTS
from bmoe_edge.engine import Engine
from bmoe_edge.engine.batching import generate_together
from bmoe_edge.engine.settings import StreamConfig

model, tokens, repeats, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for repack in ("off", "all"):
    with Engine(model, StreamConfig(stream=False, threads=threads, ctx=512, parallel=4, repack=repack)) as e:
        prompts = [e.tokenize(p) for p in PROMPTS[:4]]
        generate_together(e, prompts, 4)  # the file's pages in
        for r in range(repeats):
            for n in (1, 4):
                steps = []
                t0 = time.perf_counter()
                gens = generate_together(e, prompts[:n], tokens, steps=steps)
                wall = time.perf_counter() - t0
                dec = [s for s in steps if s.n_decoding == s.n_sequences and s.n_tokens == n]
                print(json.dumps({"model": model.rsplit("/", 1)[-1], "repack": repack, "threads": threads,
                                  "flash_attn": e.run_info["flash_attn"], "repeat": r, "sequences": n,
                                  "tok_s": sum(len(g.tokens) for g in gens) / wall,
                                  "decode_ms_per_step": sum(s.wall_ms for s in dec) / max(1, len(dec)),
                                  "steps": len(dec)}), flush=True)
