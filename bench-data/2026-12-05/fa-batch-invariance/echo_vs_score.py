from dataclasses import replace, asdict
from bmoe_edge.cli.common import machine_config
from bmoe_edge.engine import Engine, StreamConfig
from bmoe_edge.synthetic import tinymoe
from bmoe_edge.serve.worker import _prompt_logprobs
m = tinymoe.fixture("qwen3moe", "Q8_0")
PROMPT = "Once upon a time there was a fox"
cfg = machine_config(None, {"ctx": 512}, conversation=True)
ref_cfg = StreamConfig(threads=1)
print({k: (v, getattr(ref_cfg, k)) for k, v in asdict(cfg).items() if v != getattr(ref_cfg, k)})
with Engine(m, ref_cfg) as e:
    ids = e.tokenize(PROMPT); ref = e.score(ids)
with Engine(m, cfg) as e:
    got = [p.chosen.logprob for p in _prompt_logprobs(e, ids, 1)[1:]]
    print(max(abs(a - b) for a, b in zip(ref, got)), e.score_batch)
for name, c in (("ref", ref_cfg), ("ref-ctx512", replace(ref_cfg, ctx=512)), ("cfg", cfg), ("cfg-ctx2048", replace(cfg, ctx=2048))):
    with Engine(m, c) as e:
        s = e.score(ids); b = [p.chosen.logprob for p in e.score_positions(ids, batched=True)]
        print(name, "score-vs-ref", max(abs(a - x) for a, x in zip(ref, s)), "batched-vs-ref", max(abs(a - x) for a, x in zip(ref, b)), e.score_batch)
