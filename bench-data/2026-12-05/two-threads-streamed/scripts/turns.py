"""Two engine processes taking turns: python turns.py MODEL THREADS MODE NAME OTHER ROUNDS [key=val ...] [NAME:key=val ...]
(NAME:key=val: for that process only; added 2026-12-06, the runs above used plain key=val alone)
Environment (added 2026-12-06, session 26): CTX the context (default 256); WARM_<NAME>=1 that process's pool
populated whole before its first prompt; PROMPT_N=n each turn two prompts of n tokens not seen before instead of
the decodes (their "p10" column is then the prompt's ms per token, so ratio.py reads both alike)."""
import os, sys, time
from dataclasses import replace
from pathlib import Path
from bmoe_edge.boards import profiles
from bmoe_edge.engine import Engine, report, settings
from bmoe_edge.bench import kernels
from bmoe_edge.bench.kernels import PROMPT, WARMUP_TOKENS
model = Path(os.path.expanduser(sys.argv[1])); t = int(sys.argv[2]); mode = sys.argv[3]; me, other = sys.argv[4], sys.argv[5]; rounds = int(sys.argv[6])
extra = dict(a.split("=", 1) for a in sys.argv[7:] if ":" not in a.split("=")[0])
extra.update(dict(a.split(":", 1)[1].split("=", 1) for a in sys.argv[7:] if a.split("=")[0].startswith(sys.argv[4] + ":")))
base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
cfg = replace(base, threads=t, repack="auto", ctx=int(os.environ.get("CTX", "256")), flash_attn=False,
              cache_mb=kernels.full_cache_mb(model))
if mode == "resident": cfg = replace(cfg, stream=False)
for k, v in extra.items(): cfg = replace(cfg, **{k: type(getattr(cfg, k))(v) if not isinstance(getattr(cfg, k), bool) else v == "1"})
turn = Path("/tmp/diag/turn")
# ENV_A / ENV_B: "NAME=value" set in that process before its engine opens (the experiments of diag.patch)
if os.environ.get(f"ENV_{me}"):
    name, value = os.environ[f"ENV_{me}"].split("=", 1)
    os.environ[name] = value
print(me, "pid", os.getpid(), mode, os.environ.get(f"ENV_{me}", ""), flush=True)
with Engine(model, cfg) as e:
    if os.environ.get(f"WARM_{me}"):  # the pool populated whole before the first prompt (serve's idle warm, back to back)
        t0 = time.perf_counter()
        while e.warm_cache_memory(): pass
        print(me, "warmed in", round(time.perf_counter() - t0, 2), "s", flush=True)
    e.run(PROMPT, WARMUP_TOKENS)
    Path(f"/tmp/diag/ready-{me}").write_text("1")
    for r in range(rounds):
        while turn.read_text() != me: time.sleep(0.05)
        if os.environ.get("PROMPT_N"):  # prompts of PROMPT_N tokens not seen before, 2 a turn
            from bmoe_edge.bench.kernels import _prompt_ids
            for k in range(2):
                g = e.run(_prompt_ids(e.tokenize, int(os.environ["PROMPT_N"]), 2 * r + k), 1)
                print(me, r, round(report.summary(g, e.run_info)["prompt_tok_s"], 2), "p10", round(1000.0 / report.summary(g, e.run_info)["prompt_tok_s"], 3), "released", g.metrics[0].released_bytes >> 20, flush=True)
            turn.write_text(other)
            continue
        for _ in range(4):
            g = e.run(PROMPT, 129)
            ms = sorted(m.wall_ms for m in g.metrics[2:])
            print(me, r, round(report.summary(g, e.run_info)["decode_tok_s"], 2), "p10", round(ms[len(ms)//10], 2), "med", round(ms[len(ms)//2], 2), flush=True)
        turn.write_text(other)
