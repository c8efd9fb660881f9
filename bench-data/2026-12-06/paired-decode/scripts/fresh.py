"""The paired decode with each side's process lifetime as the phase says, alternating which side goes first:
`fresh`, a new engine process per repeat (load, warm every expert, 5 runs of 64 tokens) against llama-bench's own
new process per repeat; `held`, one streamed engine held across the repeats (bench kernels' design); `held-resident`,
the same engine without streaming (llama.cpp's own buffers and kernels, no seam). Two threads, flash attention off,
llama-bench at the engine's depth.
python fresh.py MODEL ROUNDS PHASES (comma list of fresh; held: the streamed engine; held-resident: the same without
streaming; llama-bench: llama-bench in the engine's place)"""
import json, os, statistics as st, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "host-not-compaction" / "scripts"))
from full_cache import config  # session 26's engine settings, shared, not copied
from bmoe_edge.bench import llama_bench
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
from bmoe_edge.engine import Engine, report

T, RUNS, TOK = 2, 5, 64

def engine_runs(e):
    out = []
    for _ in range(RUNS):
        g = e.run(PROMPT, TOK + 1)
        out.append(float(report.summary(g, e.run_info)["decode_tok_s"]))
    return out

if sys.argv[1] == "--child":
    model = Path(sys.argv[2])
    with Engine(model, config(model, T, ctx=128)) as e:
        n = len(e.run(PROMPT, WARMUP_TOKENS).prompt_tokens)
        print(json.dumps({"prompt_len": n, "runs": engine_runs(e)}), flush=True)
    sys.exit(0)

model = Path(os.path.expanduser(sys.argv[1])); rounds = int(sys.argv[2]); phases = sys.argv[3].split(",")

def fresh_engine():
    r = subprocess.run([sys.executable, __file__, "--child", str(model)], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])

def lb(depth):
    return llama_bench.run(model, threads=T, decode_tokens=TOK, prompt_tokens=0, flash_attn="off",
                           repetitions=RUNS, depths=(depth,))["decode_samples"]

depth = fresh_engine()["prompt_len"]
print(f"# {model.name} threads {T} depth {depth} {time.strftime('%H:%M:%S')}", flush=True)
for phase in phases:
    ratios = []
    held = (Engine(model, config(model, T, ctx=128, mode="resident" if phase.endswith("resident") else "stream"))
            if phase.startswith("held") else None)
    if held:
        held.run(PROMPT, WARMUP_TOKENS)
    for r in range(rounds):
        def mine():
            if phase == "llama-bench":
                return lb(depth)   # the anchor against itself: what the pairing reads for two equal programs
            return engine_runs(held) if held else fresh_engine()["runs"]
        if r % 2 == 0:
            a = mine(); b = lb(depth)
        else:
            b = lb(depth); a = mine()
        ratio = st.median(a) / st.median(b); ratios.append(ratio)
        print(f"{phase} {r} {'eng' if r % 2 == 0 else 'lb '} first: engine {st.median(a):.2f} [{' '.join(f'{x:.1f}' for x in a)}] "
              f"llama-bench {st.median(b):.2f} [{' '.join(f'{x:.1f}' for x in b)}] ratio {ratio:.3f}", flush=True)
    if held:
        held.close()
    print(f"== {phase}: median ratio {st.median(ratios):.3f} (min {min(ratios):.3f} max {max(ratios):.3f}) {time.strftime('%H:%M:%S')}", flush=True)
