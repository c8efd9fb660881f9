"""Speculative decoding (issue 12) on the 3 GB uniform-routing preset, cache off (every routed expert
read from the disk each step), 1 compute thread, 4 lanes, overlap on; plain vs `--speculative ngram`,
interleaved, on two prompts: one that repeats the model's own continuation (what a repetitive text
is to a real model: the continuation is already in the context), one that repeats a phrase the model
does not continue (drafts found, then rejected: the case speculation must not lose) and a plain one.

Run from the repository root: .venv/bin/python bench-data/2026-12-01/speculative/measure.py MODEL OUT.json
"""

import json
import sys
import time
from dataclasses import replace

from bmoe_edge.engine import Engine, StreamConfig

model, out = sys.argv[1], sys.argv[2]
TOKENS, REPEATS = 32, 2
base = StreamConfig(threads=1, io_threads=4, overlap=True, cache_mb=0, ctx=512, batch=64, ubatch=64)
plain_prompt = "In a small village by the sea, an old sailor said"
records = []
with Engine(model, base) as e:
    warm = e.run(plain_prompt, TOKENS)
    echo_prompt = warm.prompt_tokens + warm.tokens + warm.prompt_tokens  # the continuation, then the prompt again
prompts = {"repetitive": echo_prompt, "rejecting": "one two three four five, " * 6 + "one two three",
           "plain": plain_prompt}
for repeat in range(REPEATS):
    for name, prompt in prompts.items():
        for spec in ("off", "ngram"):
            with Engine(model, replace(base, speculative=spec, draft_max=8)) as e:
                t0 = time.perf_counter()
                g = e.run(prompt, TOKENS)
                wall = time.perf_counter() - t0
            decode = g.metrics[1:]
            ms = sum(m.wall_ms for m in decode)
            records.append({
                "repeat": repeat, "prompt": name, "speculative": spec, "tokens": g.tokens,
                "decode_tok_s": 1000 * len(decode) / ms, "decodes": sum(1 for m in decode if m.n_tokens),
                "drafted": sum(m.drafted for m in g.metrics), "accepted": sum(m.accepted for m in g.metrics),
                "bytes_read_per_token": sum(m.bytes_read for m in decode) / len(decode), "wall_s": wall,
            })
            r = records[-1]
            print(f"[{repeat}] {name:<10} {spec:<5} {r['decode_tok_s']:6.2f} tok/s decodes {r['decodes']:>3} "
                  f"accepted {r['accepted']:>3}/{r['drafted']:<3} MiB/token {r['bytes_read_per_token'] / 2**20:6.1f}",
                  flush=True)
with open(out, "w") as f:
    json.dump(records, f, indent=1)
