"""--parallel: several sequences in one context, one batched decode a step (engine/batching.py, serve)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bmoe_edge.engine import Engine
from bmoe_edge.engine.batching import generate_together
from bmoe_edge.proof.batch_gate import BATCH_PROMPTS, check_batch, format_result
from bmoe_edge.proof.gates import BASE
from bmoe_edge.synthetic import tinymoe


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize(("arch", "quant"), [("qwen3moe", "Q8_0"), ("qwen2moe", "Q4_K_M")])
def test_a_batch_streamed_equals_resident_and_each_sequence_its_tokens_alone(arch: str, quant: str, n: int) -> None:
    result = check_batch(tinymoe.fixture(arch, quant), f"{arch}-{quant}", n)
    assert result.passed, format_result(result)
    assert 0 < result.union_bytes < result.summed_bytes  # the batch's experts read once for all of them


def test_a_slot_freed_mid_batch_takes_a_new_prompt_and_the_others_go_on() -> None:
    model = tinymoe.fixture("qwen3moe", "Q8_0")
    with Engine(model, BASE) as alone:
        prompts = [alone.tokenize(p) for p in BATCH_PROMPTS[:3]]
        want = [alone.run(p, 8).tokens for p in prompts]
    with Engine(model, replace(BASE, parallel=2, prefill_chunk=4)) as engine:
        first = generate_together(engine, prompts[:2], 3)   # both stopped after 3 tokens, KV kept
        engine.slot_stop(0, forget=True)
        # slot 0 takes a new prompt while slot 1 continues its conversation (its prefix reused)
        again = generate_together(engine, [prompts[2], prompts[1] + first[1].tokens], 5, reuse_kv=True)
        assert again[1].reused_tokens == len(prompts[1]) + 2  # all but the last token it held
        assert again[0].tokens == want[2][:5]
        assert first[1].tokens + again[1].tokens == want[1]
        # the single-sequence path of a --parallel engine is the plain one
        assert engine.run(prompts[0], 8).tokens == want[0]
        with pytest.raises(Exception, match="slot 2 does not exist"):
            engine.slot_begin(2, prompts[0])

