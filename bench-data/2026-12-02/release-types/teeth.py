from dataclasses import replace
from bmoe_edge.proof import gates
res = gates.fixture_resolver(None)
for arch, quant in (("deepseek4", "MXFP4"), ("kimi-k3", "MXFP4"), ("deepseek4", "Q4_K_M"), ("mimo2", "MXFP4_MOE")):
    spec = gates.FixtureSpec(arch, quant)
    good = gates.CASES["cache-off"]
    cells = [gates.GateCell(spec, good)] + [gates.GateCell(spec, replace(good, name=f"corrupt-{n}", overrides={"fault": f"corrupt:{n}"})) for n in (1, 7, 40)]
    for r in gates.run_gates(cells, res, steps=12):
        print(arch, quant, r.config, "passed" if r.passed else "FAILED", "tokens", r.equal_tokens, "logits", r.equal_logits, "first_diff", r.first_difference, flush=True)
