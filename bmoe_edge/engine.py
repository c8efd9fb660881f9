"""The Python face of the native engine: a typed configuration, generation as an iterator."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from bmoe_edge import native
from bmoe_edge.errors import BmoeError

CacheMb = float | Literal["auto"]


@dataclass(frozen=True)
class StreamConfig:
    """Every knob of a run. The defaults are a sensible host run; a board profile supplies its own."""

    stream: bool = True
    cache_mb: CacheMb = 0
    cache_floor_mb: int = 1024
    cache_ceil_mb: int = 1 << 20
    io_threads: int = 4
    read_path: Literal["pread", "odirect"] = "odirect"
    dense: Literal["mmap", "anon"] = "mmap"
    overlap: bool = False
    threads: int = 0
    ctx: int = 2048
    batch: int = 512
    ubatch: int = 512
    flash_attn: bool = False
    fault: str = ""  # test-only: "corrupt:N" or "fail:N" (the Nth slice read)

    def __post_init__(self) -> None:
        if self.cache_mb != "auto" and (not isinstance(self.cache_mb, int | float) or self.cache_mb < 0):
            raise BmoeError(f"cache_mb must be a number of MiB >= 0 or 'auto', got {self.cache_mb!r}")
        if not 1 <= self.io_threads <= 64:
            raise BmoeError(f"io_threads must be between 1 and 64, got {self.io_threads}")
        if self.read_path not in ("pread", "odirect"):
            raise BmoeError(f"read_path must be pread or odirect, got {self.read_path!r}")
        if self.dense not in ("mmap", "anon"):
            raise BmoeError(f"dense must be mmap or anon, got {self.dense!r}")
        if self.threads < 0:
            raise BmoeError(f"threads must be >= 0 (0 = all cores), got {self.threads}")
        _parse_fault(self.fault)

    def to_native(self):  # -> bmoe_edge._native.StreamConfig
        n = native.load()
        c = n.StreamConfig()
        c.stream = self.stream
        c.cache_mb = -1.0 if self.cache_mb == "auto" else float(self.cache_mb)
        c.cache_floor_mb = self.cache_floor_mb
        c.cache_ceil_mb = self.cache_ceil_mb
        c.io_threads = self.io_threads
        c.read_path = getattr(n.ReadPath, self.read_path)
        c.dense = getattr(n.DenseMode, self.dense)
        c.overlap = self.overlap
        c.threads = self.threads
        c.ctx = self.ctx
        c.batch = self.batch
        c.ubatch = self.ubatch
        c.flash_attn = self.flash_attn
        kind, nth = _parse_fault(self.fault)
        c.fault_kind = getattr(n.FaultKind, kind)
        c.fault_nth = nth
        return c


def _parse_fault(fault: str) -> tuple[str, int]:
    if not fault:
        return "none", 0
    kind, _, nth = fault.partition(":")
    if kind not in ("corrupt", "fail") or not nth.isdigit() or int(nth) < 1:
        raise BmoeError(f"fault must be corrupt:N or fail:N with N >= 1, got {fault!r}")
    return kind, int(nth)


@dataclass(frozen=True)
class Sampling:
    temp: float = 0.0  # 0 = greedy
    top_k: int = 40
    top_p: float = 0.95
    seed: int = 0


@dataclass(frozen=True)
class TokenMetrics:
    step: int
    n_tokens: int
    wall_ms: float
    io_ms: float
    stall_ms: float
    drain_ms: float
    compute_ms: float
    bytes_read: int
    slice_bytes: int
    copy_bytes: int
    cache_lookups: int
    cache_hits: int
    evictions: int
    major_faults: int
    rss_bytes: int
    resident_expert_bytes: int


@dataclass(frozen=True)
class Token:
    """One generated token as it arrives."""

    id: int
    text: str
    metrics: TokenMetrics
    logits: bytes = b""  # raw float32 logits of this step, when requested


@dataclass
class Generation:
    """What one generation produced, complete once its iterator is exhausted."""

    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    metrics: list[TokenMetrics] = field(default_factory=list)
    logits: list[bytes] = field(default_factory=list)
    stop_reason: str = ""  # "max_tokens", "end_of_generation", "context_full"


def _metrics(m) -> TokenMetrics:
    return TokenMetrics(**{f.name: getattr(m, f.name) for f in fields(TokenMetrics)})


RUN_INFO_FIELDS = (
    "model", "architecture", "n_layer", "n_expert", "n_expert_used", "streaming", "streamed_tensors",
    "expert_bytes", "file_bytes", "n_files", "threads", "io_threads", "read_path_requested", "read_path",
    "read_path_note", "dio_align", "page_size", "cache_budget_mb", "cache_mode", "dense", "overlap",
    "hook_compiled_in", "lazy_load", "ctx", "batch", "ubatch", "flash_attn", "fault", "warning", "load_ms",
    "load_bytes_read", "load_major_faults", "rss_after_load", "routed_bytes_per_token",
)


class Engine:
    """One model, one context. `with Engine(path, config) as e: for tok in e.generate(...)`."""

    def __init__(self, model_path: str | Path, config: StreamConfig | None = None) -> None:
        self.config = config or StreamConfig()
        n = native.load()
        with native.engine_errors():
            self._native = n.Engine(str(model_path), self.config.to_native())
        self._step = n.StepResult

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._native = None

    @property
    def run_info(self) -> dict[str, object]:
        info = self._live().run_info
        return {name: getattr(info, name) for name in RUN_INFO_FIELDS}

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return list(self._live().tokenize(text, add_special))

    def generate(
        self,
        prompt: str | list[int],
        max_tokens: int,
        sampling: Sampling | None = None,
        *,
        logits: bool = False,
        result: Generation | None = None,
    ) -> Iterator[Token]:
        """Yield tokens as they are generated; `result` (if given) is filled in along the way."""
        engine = self._live()
        prompt_ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        s = sampling or Sampling()
        n = native.load()
        params = n.SamplingParams()
        params.temp, params.top_k, params.top_p, params.seed = s.temp, s.top_k, s.top_p, s.seed
        out = result if result is not None else Generation(prompt_ids)
        out.prompt_tokens = prompt_ids
        with native.engine_errors():
            engine.begin(prompt_ids, params, logits)
        pending = b""
        step = self._step()
        while len(out.tokens) < max_tokens:
            with native.engine_errors():
                advanced = engine.next(step)
            if not advanced:
                out.stop_reason = "context_full"
                return
            metrics = _metrics(step.metrics)
            out.metrics.append(metrics)
            if logits:
                out.logits.append(step.logits)
            if step.end_of_generation:
                out.stop_reason = "end_of_generation"
                return
            # A piece can end inside a multi-byte character: emit text only when it decodes.
            pending += step.piece
            try:
                text = pending.decode("utf-8")
                pending = b""
            except UnicodeDecodeError:
                text = ""
            out.tokens.append(step.token)
            out.text += text
            yield Token(step.token, text, metrics, step.logits if logits else b"")
        out.stop_reason = "max_tokens"

    def run(self, prompt: str | list[int], max_tokens: int, sampling: Sampling | None = None, *,
            logits: bool = False) -> Generation:
        """Generate to the end and return everything."""
        result = Generation([])
        for _ in self.generate(prompt, max_tokens, sampling, logits=logits, result=result):
            pass
        return result

    def _live(self):
        if self._native is None:
            raise BmoeError("the engine is closed")
        return self._native

