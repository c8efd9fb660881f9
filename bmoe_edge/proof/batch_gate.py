"""The batch gate (--parallel): several sequences decoded together in one context.

Streamed == resident holds for a batch as for one sequence: the same prompts in the same slots, stepped
together with the same chunking (so every step's batch is the same on both sides), must give the same token
ids and the same raw logits, byte for byte. Besides, each sequence's greedy tokens must be the ones it gets
alone (one sequence, no batch); its logits alone are compared too and the largest difference reported: a
batch's kernels may round differently (a prompt chunked into several ubatches, the matmuls of a wider batch),
which docs/gates.md records as measured.
"""

from __future__ import annotations

import array
from dataclasses import dataclass, replace
from pathlib import Path

from bmoe_edge.engine import Engine, Generation, info
from bmoe_edge.engine.batching import StepInfo, generate_together
from bmoe_edge.errors import BmoeError
from bmoe_edge.proof.gates import BASE, CASES, stream_config

# Of different lengths: the short ones decode while the long ones still take their prompt in chunks.
BATCH_PROMPTS = (
    "The quick brown fox jumps over the lazy dog. Once upon a time",
    "In a small village by the sea, an old sailor said",
    "Line 1: the fox, the dog and the sailor met by the sea. Line 2: the fox, the dog and the sailor met by",
    "Hello",
)
CHUNK = 8  # prompt tokens a step: the long prompts span several steps beside the others' decodes
STEPS = 16


@dataclass
class BatchResult:
    fixture: str
    case: str
    n_sequences: int
    passed: bool = False
    equal_tokens: bool = False          # streamed == resident, the same batches
    equal_logits: bool = False
    alone_tokens: bool = False          # each sequence's tokens == the same prompt decoded alone
    alone_max_logit_diff: float = 0.0   # measured, not gated: batched kernels may round differently
    bytes_read: int = 0
    union_bytes: int = 0                # decode-only steps: the distinct experts of the batch ...
    summed_bytes: int = 0               # ... and what its sequences route to each alone
    error: str = ""


def _max_diff(a: list[bytes], b: list[bytes]) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=False):
        if x != y:
            fx, fy = array.array("f", x), array.array("f", y)
            worst = max(worst, max(abs(p - q) for p, q in zip(fx, fy, strict=True)))
    return worst


def _together(model: Path, config, prompts: list[list[int]], steps: int,
              infos: list[StepInfo] | None = None) -> list[Generation]:
    with Engine(model, config) as engine:
        return generate_together(engine, prompts, steps, logits=True, steps=infos)


def check_batch(model: Path, label: str, n: int, case: str = "cache-small", steps: int = STEPS) -> BatchResult:
    """One cell: `n` of BATCH_PROMPTS in one batch, resident and streamed with `case`."""
    result = BatchResult(label, case, n)
    try:
        with Engine(model, BASE) as alone_engine:
            prompts = [alone_engine.tokenize(p) for p in BATCH_PROMPTS[:n]]
            alone = [alone_engine.run(p, steps, logits=True) for p in prompts]
        batched = replace(BASE, parallel=n, prefill_chunk=CHUNK)
        resident = _together(model, batched, prompts, steps)
        expert_bytes = info.model_summary(model).expert_bytes
        infos: list[StepInfo] = []
        streamed_config = replace(stream_config(CASES[case], expert_bytes), parallel=n, prefill_chunk=CHUNK)
        streamed = _together(model, streamed_config, prompts, steps, infos)
    except BmoeError as exc:
        result.error = str(exc)
        return result
    result.equal_tokens = all(r.tokens == s.tokens for r, s in zip(resident, streamed, strict=True))
    result.equal_logits = all(r.logits == s.logits for r, s in zip(resident, streamed, strict=True))
    result.alone_tokens = all(a.tokens == s.tokens for a, s in zip(alone, streamed, strict=True))
    result.alone_max_logit_diff = max(_max_diff(a.logits, s.logits) for a, s in zip(alone, streamed, strict=True))
    result.bytes_read = sum(i.bytes_read for i in infos)
    decoding = [i for i in infos if i.summed_bytes]
    result.union_bytes = sum(i.union_bytes for i in decoding)
    result.summed_bytes = sum(i.summed_bytes for i in decoding)
    result.passed = result.equal_tokens and result.equal_logits and result.alone_tokens and result.bytes_read > 0
    if result.bytes_read == 0:
        result.error = "streamed run read nothing: the seam did not engage"
    return result


def format_result(r: BatchResult) -> str:
    verdict = "PASS" if r.passed else "FAIL"
    share = f"{100 * r.union_bytes / r.summed_bytes:.0f}%" if r.summed_bytes else "-"
    return (f"{verdict} {r.fixture} batch-{r.n_sequences} {r.case}: tokens {r.equal_tokens} logits {r.equal_logits} "
            f"alone-tokens {r.alone_tokens} alone-max-logit-diff {r.alone_max_logit_diff:.3g} union/summed {share}"
            + (f" ({r.error})" if r.error else ""))
