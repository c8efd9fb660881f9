"""The fuzz campaign: mutated models through `info` and `generate`, and no run may end by a signal.

Mutations of a small fixture (header, metadata, tensor table, offsets, data): truncations at every
section boundary (and one byte either side), random byte flips in each section, and integer fields
of the metadata and the tensor table overwritten with extreme values. The section boundaries and
the integer fields come from the `gguf` package's reader (host side). Each mutated file goes
through the engine's model probe (`info`) and a two-token generation, in a worker process: a run
ends `ok` (it worked), `error` (one line of the package's error type), `bad-error` (anything else
escaped: another exception type, or a message of several lines), `signal` (the worker died: an
abort, a segfault) or `hang` (no answer within the case timeout). Only `ok` and `error` pass.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

OUTCOMES = ("ok", "error", "bad-error", "signal", "hang")
PASSING = ("ok", "error")
MODES = ("info", "generate")
EXTREMES = (0, 1, 0x7F, 0xFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 0x7FFF_FFFF_FFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF, 0x8000_0000)


@dataclass(frozen=True)
class Mutation:
    name: str       # what was done, e.g. "truncate@1234" or "flip:tensor-table@5678"
    data: bytes


@dataclass(frozen=True)
class FuzzResult:
    mutation: str
    mode: str
    outcome: str
    detail: str = ""

    def record(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Layout:
    """Where a gguf's sections are: boundaries, and the integer fields (offset, size) of its header."""

    size: int
    kv_start: int
    table_start: int
    data_start: int
    boundaries: tuple[int, ...]
    integers: tuple[tuple[int, int], ...]  # every integer of the header, metadata and tensor table
    values: tuple[tuple[int, int], ...]    # the metadata's scalar integer values (block count, expert count, ...)


def layout(path: Path) -> Layout:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    size = path.stat().st_size
    fields = list(reader.fields.values())
    kv_fields = [f for f in fields if not f.name.startswith("GGUF.")]
    table = [t.field for t in reader.tensors]
    bounds = {0, 4, 8, 16, 24, size, reader.data_offset}
    integers: list[tuple[int, int]] = [(8, 8), (16, 8)]  # tensor count, kv count
    values: list[tuple[int, int]] = []
    table_ids = {id(f) for f in table}
    for f in [*kv_fields, *table]:
        # A metadata field: key length, key, value type, then the value (an array: its type, count
        # and elements - the elements' own parts are left out, the vocabulary alone has hundreds).
        # A tensor-table entry: name length, name, dimension count, dimensions, type, offset.
        parts = f.parts if id(f) in table_ids else f.parts[:6]
        bounds.add(f.offset)
        at = f.offset
        for i, part in enumerate(parts):
            if part.dtype.kind in "iu" and part.nbytes in (1, 2, 4, 8) and part.size == 1:
                integers.append((at, part.nbytes))  # lengths, counts, types, dims, offsets
                if id(f) not in table_ids and len(f.parts) == 4 and i == 3:
                    values.append((at, part.nbytes))
            at += part.nbytes
            bounds.add(at)
        bounds.add(f.offset + sum(p.nbytes for p in f.parts))
    bounds.update(t.data_offset for t in reader.tensors)
    kv_start = min((f.offset for f in kv_fields), default=24)
    table_start = min((f.offset for f in table), default=reader.data_offset)
    return Layout(size, kv_start, table_start, reader.data_offset, tuple(sorted(b for b in bounds if b <= size)),
                  tuple(integers), tuple(values))


def truncations(data: bytes, lay: Layout) -> list[Mutation]:
    """The file cut at every section boundary and one byte before it."""
    cuts = sorted({c for b in lay.boundaries for c in (b - 1, b) if 0 <= c < lay.size})
    return [Mutation(f"truncate@{cut}", data[:cut]) for cut in cuts]


def _section(lay: Layout, offset: int) -> str:
    if offset < lay.kv_start:
        return "header"
    if offset < lay.table_start:
        return "metadata"
    return "tensor-table" if offset < lay.data_start else "data"


def random_mutation(data: bytes, lay: Layout, rng: random.Random) -> Mutation:
    buf = bytearray(data)
    roll = rng.random()
    if roll < 0.45:  # an integer of the header, metadata or tensor table (a third: a metadata value)
        at, width = rng.choice(lay.values if lay.values and rng.random() < 0.33 else lay.integers)
        value = rng.choice(EXTREMES) if rng.random() < 0.7 else rng.getrandbits(8 * width)
        value &= (1 << (8 * width)) - 1
        buf[at:at + width] = value.to_bytes(width, "little")
        return Mutation(f"int:{_section(lay, at)}@{at}={value:#x}", bytes(buf))
    if roll < 0.92:  # byte flips in the header, metadata or tensor table
        low, high = 0, lay.data_start
    else:           # byte flips in the data
        low, high = lay.data_start, lay.size
    at = rng.randrange(low, high)
    count = rng.choice((1, 1, 2, 4, 8))
    for i in range(count):
        if at + i < len(buf):
            buf[at + i] ^= rng.randrange(1, 256)
    return Mutation(f"flip{count}:{_section(lay, at)}@{at}", bytes(buf))


def mutations(model: Path, count: int, seed: int) -> Iterator[Mutation]:
    """`count` mutations: the truncations (in random order) alternating with random mutations; once
    every truncation is used, random mutations only. A small count samples every kind."""
    data = model.read_bytes()
    lay = layout(model)
    rng = random.Random(seed)
    cuts = truncations(data, lay)
    rng.shuffle(cuts)
    for n in range(count):
        yield cuts.pop() if cuts and n % 2 == 0 else random_mutation(data, lay, rng)


def seed_model(workdir: Path) -> Path:
    """The fixture every mutation starts from: the qwen3moe Q8_0 tiny model with a 300-token
    vocabulary (a small file: fast to mutate, parse and load)."""
    from bmoe_edge.synthetic import tinymoe

    path = workdir / "seed-qwen3moe-Q8_0-v300.gguf"
    if not path.is_file():
        tinymoe.write_tiny_moe(path, "qwen3moe", "Q8_0", vocab_size=300)
    return path


# --- the worker: one process running cases until it dies ------------------------------------------


def _run_one(mode: str, path: str) -> dict[str, str]:
    from bmoe_edge.engine import Engine, StreamConfig, info
    from bmoe_edge.errors import BmoeError

    try:
        if mode == "info":
            info.model_summary(Path(path))
        else:
            config = StreamConfig(threads=1, ctx=64, batch=32, ubatch=32, cache_mb=0, overlap=False, io_threads=1,
                                  io_timeout=10)
            with Engine(path, config) as engine:
                engine.run("Hello", 2)
    except BmoeError as exc:
        message = str(exc)
        return {"outcome": "error" if message and "\n" not in message else "bad-error", "detail": message}
    except Exception as exc:  # anything else escaping is what the campaign looks for
        return {"outcome": "bad-error", "detail": f"{type(exc).__name__}: {exc}"}
    return {"outcome": "ok", "detail": ""}


def worker() -> None:
    """Read `mode<TAB>path` lines, answer one JSON line each."""
    for line in sys.stdin:
        mode, _, path = line.rstrip("\n").partition("\t")
        print(json.dumps(_run_one(mode, path)), flush=True)


class Worker:
    """A worker process; restarted after it dies or hangs."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ, GGML_NO_BACKTRACE="1")  # an abort is a result here, not a debugging session
        return subprocess.Popen([sys.executable, "-m", "bmoe_edge.proof.fuzz"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)

    def run(self, mode: str, path: Path) -> tuple[str, str]:
        import selectors

        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(f"{mode}\t{path}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            ready = sel.select(self.timeout)
        if not ready:
            self.close()
            return "hang", f"no answer within {self.timeout:g} s"
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            return "signal", f"worker ended with {code}" + (f" (signal {-code})" if code < 0 else "")
        answer = json.loads(line)
        return answer["outcome"], answer["detail"]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def run_campaign(model: Path, workdir: Path, count: int, seed: int = 0, timeout: float = 60.0) -> Iterator[FuzzResult]:
    """Each mutation through every mode; yields results as they come."""
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / "fuzzed.gguf"
    runner = Worker(timeout)
    try:
        for m in mutations(model, count, seed):
            target.write_bytes(m.data)
            for mode in MODES:
                outcome, detail = runner.run(mode, target)
                yield FuzzResult(m.name, mode, outcome, detail)
    finally:
        runner.close()


def table(results: list[FuzzResult]) -> str:
    counts = Counter((r.mode, r.outcome) for r in results)
    lines = ["| mode | " + " | ".join(OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 1) + "|"]
    for mode in MODES:
        lines.append(f"| {mode} | " + " | ".join(str(counts[(mode, o)]) for o in OUTCOMES) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    worker()
