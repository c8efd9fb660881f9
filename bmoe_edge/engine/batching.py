"""--parallel: several generations in one context, advanced together. Each step is one batched decode (the
native `Engine::step_slots`): the next token of every slot past its prompt, and a chunk of the prompts still
going in. Here the native step becomes per-slot events with their text, and a whole batch of prompts can run
to the end together (the gate, the tests)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from bmoe_edge.engine.generation import Generation, PieceText, Sampling, Token, token_of
from bmoe_edge.engine.session import Engine


@dataclass(frozen=True)
class StepInfo:
    """One batched step, as /metrics and the bench count it."""

    n_sequences: int    # slots in the batch
    n_decoding: int     # ... that decoded one token (the others took a prompt chunk)
    n_tokens: int       # tokens in the batch
    wall_ms: float
    union_bytes: int    # the distinct experts the batch routed to (each read at most once)
    summed_bytes: int   # what the decoding slots route to each alone (0 on a step with a prompt chunk)
    bytes_read: int


@dataclass(frozen=True)
class SlotEvent:
    """What one step did for one slot: a token, or (token None) a chunk of its prompt taken in."""

    slot: int
    token: Token | None
    end_of_generation: bool = False
    context_full: bool = False


def step(engine: Engine, text: PieceText) -> tuple[list[SlotEvent], StepInfo | None]:
    """One step of every active slot: ([], None) when no slot is active; info None when the step decoded nothing
    (each slot handed out a token a verify had already accepted)."""
    native = engine.step_slots()
    m = native.metrics
    info = None if native.n_sequences == 0 else StepInfo(native.n_sequences, native.n_decoding, m.n_tokens, m.wall_ms,
                                                         m.routed_bytes, native.summed_bytes, m.bytes_read)
    events = []
    for s in native.slots:
        if not s.produced:
            events.append(SlotEvent(s.slot, None, context_full=s.context_full))
            continue
        token = token_of(s.result, text, s.slot)
        events.append(SlotEvent(s.slot, token, end_of_generation=s.result.end_of_generation))
    return events, info


def generate_together(engine: Engine, prompts: Sequence[Sequence[int]], max_tokens: int,
                      sampling: Sampling | None = None, *, logits: bool = False,
                      steps: list[StepInfo] | None = None, reuse_kv: bool = False) -> list[Generation]:
    """Every prompt in its own slot (0, 1, ...), all begun at once and stepped together to the end: one
    Generation each, as `Engine.generate` fills it (Generation.add). `steps` (if given) gets each decoding step's
    StepInfo; `reuse_kv` keeps each slot's common prefix with its prompt."""
    if len(prompts) > engine.n_slots:
        raise ValueError(f"{len(prompts)} prompts for {engine.n_slots} slots")
    started = time.perf_counter()
    text = PieceText()
    out = [Generation(list(p)) for p in prompts]
    for slot, ids in enumerate(prompts):
        text.start(slot)
        out[slot].reused_tokens = engine.slot_begin(slot, ids, sampling, logits=logits, reuse_kv=reuse_kv)
    live = set(range(len(prompts)))
    if max_tokens <= 0:
        for g in out:
            g.stop_reason = "max_tokens"
        live.clear()
    while live:
        events, info = step(engine, text)
        if not events:
            break
        if steps is not None and info is not None:
            steps.append(info)
        for e in events:
            g = out[e.slot]
            if e.context_full:
                g.stop_reason = "context_full"
                live.discard(e.slot)
            if e.token is None or e.slot not in live:
                continue
            if not g.add(e.token, e.end_of_generation, started, max_tokens=max_tokens, logits=logits):
                if g.stop_reason == "max_tokens":
                    engine.slot_stop(e.slot)
                live.discard(e.slot)
    return out
