"""The offline cache simulator (bench cache-sim): its LRU is the engine's ExpertCache step for step, the
hindsight optimum bounds every policy, a frequency-aware policy keeps a hot set a batch's scan would
sweep out, and a trace that is not one is refused in one line. Synthetic traces: no model."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bmoe_edge.bench import cache_sim as cs
from bmoe_edge.engine import native
from bmoe_edge.errors import BmoeError

LAYERS, N_EXPERT, K, SIZE = 3, 32, 4, 1000


def _trace(sequences: int, steps: int = 80, seed: int = 0, hot: int = 6) -> cs.Trace:
    """Each sequence's token routes to K experts: mostly from a small hot set, the rest anywhere."""
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        layers = []
        for _ in range(LAYERS):
            rows = []
            for _ in range(sequences):
                picks = rng.sample(range(hot), 2) + rng.sample(range(hot, N_EXPERT), K - 2)
                rows.append(tuple(picks))
            layers.append(tuple(rows))
        out.append(cs.Step(tuple(layers)))
    return cs.Trace(tuple(out), (SIZE,) * LAYERS, N_EXPERT, decode_from=1)


@pytest.mark.parametrize("sequences", [1, 4])
def test_the_simulated_policies_are_the_engines_expert_cache(sequences: int) -> None:
    """lru with equal shares is the cache before issue 30 (ranking lru), lfu-mult-h32 with the rest of
    the budget filled is the engine's default (ranking frequency), hit for hit."""
    trace = _trace(sequences)
    budget = 5 * SIZE * LAYERS + SIZE
    factory = native.load().parts.ExpertCache
    for mine, shares, ranking in ((cs.Lru(), cs.equal_shares(trace, budget), "lru"),
                                  (cs.Lfu(32, mult=True), cs.filled_shares(trace, budget), "frequency")):
        ours = cs.replay(trace, mine, shares)
        engine = cs.replay(trace, cs.Native(factory, budget, ranking), shares)
        assert (ours.hits, ours.lookups, ours.bytes_read) == (engine.hits, engine.lookups, engine.bytes_read)
    assert cs.equal_shares(trace, budget) == [5] * LAYERS and cs.filled_shares(trace, budget) == [6, 5, 5]


def test_belady_bounds_every_policy_and_frequency_beats_lru_on_a_batch() -> None:
    trace = _trace(4)
    shares = cs.equal_shares(trace, 6 * SIZE * LAYERS)
    results = {p.name: cs.replay(trace, p, shares) for p in (m() for m in cs.candidates())}
    best = results["belady"].bytes_read
    assert all(r.bytes_read >= best for r in results.values())
    # four sequences' union (~13 of 32 a layer) sweeps a share of 6 under LRU; counts keep the hot six
    assert results["lfu-mult-h32"].hit_rate > 0.9 * results["static"].hit_rate
    assert results["lfu-mult-h32"].bytes_read < 0.8 * results["lru"].bytes_read


def test_filled_shares_spend_the_rest_of_the_budget() -> None:
    trace = _trace(1, steps=2)
    budget = 5 * SIZE * LAYERS + 2 * SIZE + 10
    assert cs.equal_shares(trace, budget) == [5, 5, 5]
    assert cs.filled_shares(trace, budget) == [6, 6, 5]
    assert sum(cs.value_shares(trace, budget)) == 17


def test_a_file_that_is_not_a_trace_is_refused_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("step,pos,layer,experts,predicted\n0,0,0,1 2,\n1,0,0,2 3,\n")
    trace.with_suffix(".json").write_text(json.dumps({"expert_bytes": [SIZE], "n_expert": 4}))
    assert len(cs.read_trace(trace).steps) == 2
    for text in ("x,y\n1,2\n", "step,pos,layer,experts\n0,0,0,1 9\n", "step,pos,layer,experts\n0,0,5,1\n"):
        trace.write_text(text)
        with pytest.raises(BmoeError, match="not a route trace"):
            cs.read_trace(trace)
    trace.with_suffix(".json").write_text("[1]")
    with pytest.raises(BmoeError, match="not a route trace"):
        cs.read_trace(trace)


def test_the_cache_ab_twins_every_serve_cell_and_compares_each_with_its_own_one_client_cell() -> None:
    from bmoe_edge.bench import serve_bench as sb

    cells = sb.with_ab(sb.default_cells([1, 4], 0, 128), *sb.CACHE_AB)
    assert [c.label for c in cells] == ["p1-c1", "p1-c1-lru", "p4-c1", "p4-c1-lru", "p4-c4", "p4-c4-lru",
                                        "p1-c4", "p1-c4-lru"]
    assert dict(cells[1].env) == {"BMOE_CACHE_POLICY": "lru"} and cells[0].env == ()
    assert [c.label for c in sb.default_cells([1], 0, 128)] == ["p1-c1"]   # one client: one cell, not two

    def cell(label: str, tok_s: float) -> dict[str, str]:
        return {"model": "m", "repeat": "0", "cell": label, "aggregate_tok_s": str(tok_s), "long_prompt": "0",
                "union_bytes": "0", "summed_bytes": "0", "first_ttft_s": "1", "last_ttft_s": "1"}

    text = sb.summary([cell("p1-c1", 2.0), cell("p1-c1-lru", 1.0), cell("p4-c4", 3.0), cell("p4-c4-lru", 3.0)], [])
    assert "| m | 0 | p4-c4 | 3.00 | 1.50 |" in text and "| m | 0 | p4-c4-lru | 3.00 | 3.00 |" in text


def test_a_parallel_engines_route_trace_replays_to_its_own_hit_counts(tmp_path: Path) -> None:
    """The engine's --route-trace of a --parallel run (a step per batch) fed to the replay at the engine's
    budget gives exactly the hits and lookups the engine counted: the simulator is the engine's cache."""
    from dataclasses import replace

    from bmoe_edge.bench.layout import gguf_layout
    from bmoe_edge.engine import Engine
    from bmoe_edge.engine.batching import generate_together
    from bmoe_edge.proof.batch_gate import BATCH_PROMPTS
    from bmoe_edge.proof.gates import BASE
    from bmoe_edge.synthetic import tinymoe

    model = tinymoe.fixture("qwen3moe", "Q8_0")
    layout = gguf_layout(model)
    sizes = [0] * (1 + max(layout.layers()))
    for il in layout.layers():
        sizes[il] = layout.bytes_per_expert(il)
    budget = 3 * sum(sizes) + sizes[0] + 1   # 3 a layer and one more for layer 0
    trace = tmp_path / "t.csv"
    config = replace(BASE, parallel=4, prefill_chunk=64, cache_mb=budget / 2**20, route_trace=str(trace))
    with Engine(model, config) as engine:
        # one-token prompts: every slot in every step, and no prompt chunk (a chunk's step lends the cache's
        # memory to its compute buffers, which the replay does not model)
        prompts = [engine.tokenize(p)[1:2] for p in BATCH_PROMPTS[:4]]
        gens = generate_together(engine, prompts, 12)
    assert all(g.stop_reason == "max_tokens" for g in gens)
    trace.with_suffix(".json").write_text(json.dumps({"expert_bytes": sizes, "n_expert": layout.n_expert}))
    steps = cs.read_trace(trace).steps
    assert len(steps) == len(gens[0].metrics) == 12 and [s.tokens for s in steps] == [4] * 12
    replayed = cs.replay(cs.Trace(steps, tuple(sizes), layout.n_expert), cs.Lfu(32, mult=True),
                         cs.filled_shares(cs.Trace(steps, tuple(sizes), layout.n_expert), budget))
    assert (replayed.hits, replayed.lookups) == (sum(m.cache_hits for m in gens[0].metrics),
                                                  sum(m.cache_lookups for m in gens[0].metrics))
    assert 0 < replayed.hits < replayed.lookups and sum(m.evictions for m in gens[0].metrics) > 0
