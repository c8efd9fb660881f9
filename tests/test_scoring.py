"""Teacher-forced scoring (echo + logprobs, `bench quality`) in chunks (issue 44): resumable, cancellable between
chunks, the engine free for `close` between them, and batched on request; the unbatched pass is `score`'s bit for
bit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest

from bmoe_edge.engine import Engine, native
from bmoe_edge.engine.session import SCORE_CHUNK, ScoringCancelled
from bmoe_edge.errors import BmoeError, RequestError
from bmoe_edge.proof import gates
from bmoe_edge.synthetic import tinymoe

BASE = replace(gates.BASE, stream=True)


def long_text(engine: Engine) -> list[int]:
    """A text as long as the context (256 tokens)."""
    return engine.tokenize(" ".join(gates.PROMPTS) * 30)[:BASE.ctx]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with Engine(tinymoe.fixture("qwen3moe", "Q8_0"), BASE) as e:
        yield e


def test_unbatched_chunks_are_the_one_pass_bit_for_bit(engine: Engine) -> None:
    ids = long_text(engine)
    chunked = engine.score_positions(ids, 3)
    assert len(chunked) == len(ids) - 1 > SCORE_CHUNK
    assert [p.chosen.logprob for p in chunked] == engine.score(ids)  # `bench quality`'s pass, unchanged
    def values(positions: list) -> list:
        return [(p.chosen.logprob, [(t.token, t.logprob) for t in p.top]) for p in positions]

    with engine._using() as native_engine:  # today's single native call
        assert values(chunked) == values(native_engine.score_positions(ids, 3))


# The batched pass is the same model on the same text, not the same arithmetic: another batch width takes another
# kernel path (summation order, the activations' conversion), as --parallel's batches do (docs/gates.md). Measured
# on this text (x86_64, 2026-12-04), the largest difference of a chosen token's logprob: F32 8.8e-5, F16 2.0e-3,
# Q8_0 1.4e-2, Q4_K_M 0.22 (the tiny random models amplify it; Q4_K_M's kernel path is the one the batch gate
# measures). The bounds: a few times those.
@pytest.mark.parametrize(("quant", "tolerance"), [("F32", 1e-3), ("Q8_0", 0.05)])
def test_batched_scoring_is_the_unbatched_within_the_kernels_rounding(quant: str, tolerance: float) -> None:
    with Engine(tinymoe.fixture("qwen3moe", quant), BASE) as engine:
        ids = long_text(engine)
        one_by_one = engine.score_positions(ids, 3)
        batched = engine.score_positions(ids, 3, batched=True)
        assert engine.context_tokens == ids[:-1]
    assert len(batched) == len(one_by_one) == len(ids) - 1
    for position, (a, b) in enumerate(zip(one_by_one, batched, strict=True)):
        assert a.chosen.token == b.chosen.token == ids[position + 1]
        assert b.chosen.logprob == pytest.approx(a.chosen.logprob, abs=tolerance), position
        # The most likely token the same, unless the first two are within the tolerance of each other.
        if a.top[0].logprob - a.top[1].logprob > 2 * tolerance:
            assert b.top[0].token == a.top[0].token, position
        assert b.top[0].logprob == pytest.approx(a.top[0].logprob, abs=tolerance), position


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "batched"])
def test_a_cancel_after_the_first_chunk_stops_it_there(engine: Engine, batched: bool) -> None:
    ids = long_text(engine)
    whole = [p.chosen.logprob for p in engine.score_positions(ids, 0, batched=batched)]
    chunk = engine.score_batch if batched else SCORE_CHUNK
    looks: list[int] = []

    def cancelled() -> bool:
        looks.append(len(engine.context_tokens))
        return len(looks) > 1  # the client hangs up while the first chunk decodes

    with pytest.raises(ScoringCancelled) as stopped:
        engine.score_positions(ids, 2, cancelled=cancelled, batched=batched)
    assert stopped.value.scored == chunk < len(ids) - 1
    assert len(looks) == 2 and looks[1] == chunk
    assert engine.context_tokens == ids[:chunk]
    # ... and the next scoring starts afresh, with the whole answer.
    assert [p.chosen.logprob for p in engine.score_positions(ids, 0, batched=batched)] == whole


def test_close_waits_for_one_chunk_not_the_whole_text() -> None:
    with Engine(tinymoe.fixture("qwen3moe", "Q8_0"), BASE) as closing:
        ids = long_text(closing)
        second_chunk = threading.Event()
        outcome: list[BaseException] = []

        def cancelled() -> bool:
            if len(closing.context_tokens) > 0:
                second_chunk.set()
            return False

        def score() -> None:
            try:
                closing.score_positions(ids, 0, cancelled=cancelled)
            except BaseException as exc:  # handed to the test's thread
                outcome.append(exc)

        thread = threading.Thread(target=score)
        thread.start()
        assert second_chunk.wait(60)
        closing.close()  # a server's shutdown: waits for the chunk in flight only
        thread.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], BmoeError), outcome
    assert "the engine is closed" in str(outcome[0])


def test_a_chunk_refuses_a_context_something_else_moved_on(engine: Engine) -> None:
    ids = long_text(engine)
    with engine._using() as native_engine:
        native_engine.score_positions(ids, 0, 0, 16, True)
    engine.run(gates.PROMPTS[0], 2)
    with pytest.raises(BmoeError, match="score it again from position 0") as refused, \
            engine._using() as native_engine, native.engine_errors():
        native_engine.score_positions(ids, 0, 16, 16, True)
    assert not isinstance(refused.value, RequestError)  # the caller's sequence of calls, not the request's text
