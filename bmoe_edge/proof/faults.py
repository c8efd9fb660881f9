"""The fault campaign: inject read faults into streamed runs and require that none changes a token silently.

Each case is one engine opened on a fixture with one injected fault (corrupt, fail, short or hang
on the Nth slice read, N random within the run's reads) under one random configuration (1-4 read
lanes, overlap on/off, cache off/small/large, O_DIRECT/pread), slices verified against the
model's checksums and a 1 s I/O deadline. The run is compared with a resident run of the same
prompt, token ids and every step's raw logits. Each case ends as one of:

- `error`: a BmoeError with a one-line message (the fault was reported, nothing was computed on it);
- `recovered`: the run completed identical to resident after re-reading a corrupted slice;
- `not-reached`: the run completed identical to resident with the fault never injected (N past
  the run's reads) - not counted as a fault;
- `different`: the run completed and differs from resident. This must never happen.

All cases run in one process, one engine after another: the campaign also counts the process's
open file descriptors and RSS before and after (engines opened and closed hundreds of times).
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bmoe_edge.engine import Engine, Generation, StreamConfig, checksums, info
from bmoe_edge.errors import BmoeError

KINDS = ("corrupt", "fail", "short", "hang")
OUTCOMES = ("error", "recovered", "not-reached", "different")
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
STEPS = 6
BASE = StreamConfig(stream=True, threads=1, ctx=128, batch=64, ubatch=64, overlap=False, cache_mb=0, page_kb=0,
                    io_timeout=1, verify_slices=True)


@dataclass(frozen=True)
class FaultCase:
    kind: str
    nth: int
    io_threads: int
    overlap: bool
    cache: str  # off, small (a third of the experts), large (all of them)
    read_path: str


@dataclass(frozen=True)
class FaultResult:
    case: FaultCase
    outcome: str
    rereads: int
    seconds: float
    detail: str = ""

    def record(self) -> dict[str, object]:
        return {**asdict(self.case), "outcome": self.outcome, "rereads": self.rereads,
                "seconds": round(self.seconds, 3), "detail": self.detail}


def config_for(case: FaultCase, all_expert_bytes: int) -> StreamConfig:
    share = {"off": 0.0, "small": 0.3, "large": 2.0}[case.cache]
    return replace(BASE, io_threads=case.io_threads, overlap=case.overlap, read_path=case.read_path,
                   cache_mb=share * all_expert_bytes / 2**20, fault=f"{case.kind}:{case.nth}")


def slice_bytes(run_info: dict[str, object]) -> int:
    """One expert slice's bytes, from a run's info (all projections are one size in the fixtures): a token's
    routed bytes over its routed experts' slices."""
    return int(run_info["routed_bytes_per_token"]) // (int(run_info["n_expert_used"]) *
                                                        int(run_info["streamed_tensors"]))


def _reads(gen: Generation, run_info: dict[str, object]) -> int:
    """Slice reads a run made: its slice bytes over one slice's bytes."""
    return sum(m.slice_bytes for m in gen.metrics) // max(1, slice_bytes(run_info))


def reads_per_config(model: Path, all_expert_bytes: int, case: FaultCase) -> int:
    clean = replace(config_for(case, all_expert_bytes), fault="")
    with Engine(model, clean) as engine:
        return _reads(engine.run(PROMPT, STEPS), engine.run_info)


def plan(count: int, seed: int, reads: Callable[[FaultCase], int]) -> list[FaultCase]:
    """`count` random cases; hangs are 1 in 10 (each costs the deadline plus its 2 s stall)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        kind = "hang" if rng.random() < 0.1 else rng.choice(KINDS[:3])
        shape = FaultCase(kind, 1, rng.randint(1, 4), rng.random() < 0.5, rng.choice(("off", "small", "large")),
                          rng.choice(("odirect", "pread")))
        cases.append(replace(shape, nth=rng.randint(1, max(1, reads(shape)))))
    return cases


def run_case(model: Path, case: FaultCase, expected: Generation, all_expert_bytes: int) -> FaultResult:
    t0 = time.monotonic()
    try:
        with Engine(model, config_for(case, all_expert_bytes)) as engine:
            got = engine.run(PROMPT, STEPS, logits=True)
    except BmoeError as exc:
        message = str(exc)
        outcome = "error" if "\n" not in message and message else "different"  # an error must be one line
        return FaultResult(case, outcome, 0, time.monotonic() - t0, message)
    rereads = sum(m.rereads for m in got.metrics)
    same = got.tokens == expected.tokens and got.logits == expected.logits
    outcome = "different" if not same else "recovered" if rereads else "not-reached"
    detail = "" if same else f"tokens {got.tokens} != {expected.tokens}"
    return FaultResult(case, outcome, rereads, time.monotonic() - t0, detail)


def prepare(model: Path, workdir: Path) -> Path:
    """A copy of the fixture with its checksum sidecar (the campaign verifies slices)."""
    workdir.mkdir(parents=True, exist_ok=True)
    copy = workdir / model.name
    shutil.copyfile(model, copy)
    checksums.write(copy)
    return copy


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def run_campaign(model: Path, workdir: Path, count: int, seed: int = 0) -> Iterator[FaultResult]:
    """Yield each case's result as it completes (the resident run and the read counts come first)."""
    model = prepare(model, workdir)
    all_expert_bytes = info.model_summary(model).expert_bytes
    with Engine(model, replace(BASE, stream=False, verify_slices=False)) as engine:
        expected = engine.run(PROMPT, STEPS, logits=True)
    known: dict[tuple[object, ...], int] = {}

    def reads(case: FaultCase) -> int:
        key = (case.io_threads, case.overlap, case.cache, case.read_path)
        if key not in known:
            known[key] = reads_per_config(model, all_expert_bytes, case)
        return known[key]

    for case in plan(count, seed, reads):
        yield run_case(model, case, expected, all_expert_bytes)


def table(results: list[FaultResult]) -> str:
    """Counts by fault kind and outcome, as a Markdown table."""
    counts = Counter((r.case.kind, r.outcome) for r in results)
    lines = ["| fault | " + " | ".join(OUTCOMES) + " | injected |", "|---" * (len(OUTCOMES) + 2) + "|"]
    for kind in KINDS:
        row = [counts[(kind, o)] for o in OUTCOMES]
        lines.append(f"| {kind} | " + " | ".join(map(str, row)) + f" | {sum(row) - counts[(kind, 'not-reached')]} |")
    total = [sum(counts[(k, o)] for k in KINDS) for o in OUTCOMES]
    lines.append("| all | " + " | ".join(map(str, total)) + f" | {sum(total) - total[2]} |")
    return "\n".join(lines)
