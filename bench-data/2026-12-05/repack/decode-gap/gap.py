import sys, pathlib
from dataclasses import replace
from bmoe_edge.engine import Engine, StreamConfig, report
from bmoe_edge.bench import llama_bench
M = sys.argv[1]; T = int(sys.argv[2])
V = {"stream-ctx2048": dict(cache_mb=4000.0), "stream-ctx256": dict(cache_mb=4000.0, ctx=256),
     "resident-ctx2048": dict(stream=False), "resident-ctx256": dict(stream=False, ctx=256)}
for rep in range(2):
    for name, kw in V.items():
        with Engine(M, replace(StreamConfig(), threads=T, **kw)) as e:
            e.run("Once upon a time", 96)
            print(name, [round(report.summary(e.run("Once upon a time", 65), e.run_info)["decode_tok_s"], 2) for r in range(2)], flush=True)
    print("llama-bench fa0 tg64", round(llama_bench.run(pathlib.Path(M), threads=T, decode_tokens=64, prompt_tokens=0, flash_attn=False)["decode_tok_s"], 2), flush=True)
