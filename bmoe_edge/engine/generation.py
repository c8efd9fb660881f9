"""What a generation is made of: its sampling settings, each token with its step's metrics, and the
whole result. Plain data, below the engine (session) and the conversations on it (chat).

The telemetry records are declared once, as rows of `native/include/bmoe/metrics.h`: `TokenMetrics` is built
from the rows the engine exports (their names, types, defaults and help), and so are the run info's keys."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any

from bmoe_edge.engine import native
from bmoe_edge.engine.settings import Sampling  # the sampling rows' record (declared with the engine's settings)

__all__ = [
    "RUN_INFO_FIELDS",
    "TOKEN_METRICS_FIELDS",
    "Generation",
    "Logprob",
    "PieceText",
    "PositionLogprobs",
    "RecordField",
    "Sampling",
    "Token",
    "TokenMetrics",
    "metrics_of",
    "token_of",
]


@dataclass(frozen=True)
class RecordField:
    """One row of a native telemetry record (bmoe/metrics.h), seen from Python."""

    name: str
    kind: type   # bool, int, float or str
    help: str


_KINDS: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str}


def _rows(described: Any) -> tuple[RecordField, ...]:
    return tuple(RecordField(r.name, _KINDS[r.kind], r.help) for r in described)


# The rows as the engine exports them: nothing in Python lists a field.
TOKEN_METRICS_FIELDS: tuple[RecordField, ...] = _rows(native.load().token_metrics_fields())
RUN_INFO_FIELDS: tuple[RecordField, ...] = _rows(native.load().run_info_fields())


def _metrics_record() -> Any:
    defaults = native.load().TokenMetrics()
    doc = "One step's telemetry, one field per row of bmoe/metrics.h:\n\n" + "\n".join(
        f"- {f.name}: {f.help}" for f in TOKEN_METRICS_FIELDS)
    cls = make_dataclass("TokenMetrics", [(f.name, f.kind, field(default=f.kind(getattr(defaults, f.name))))
                                          for f in TOKEN_METRICS_FIELDS],
                         frozen=True, kw_only=True, namespace={"__doc__": doc})
    cls.__module__ = __name__
    return cls


# One generated step's telemetry (frozen, keyword-only; the metrics CSV's columns are its fields, in order).
TokenMetrics = _metrics_record()


@dataclass(frozen=True)
class Logprob:
    """A token and its natural log-probability at one position: the log-softmax of the position's raw
    logits (the model's distribution, before logit bias, penalties, grammar or temperature)."""

    token: int
    piece: bytes            # the token's bytes (may be part of a UTF-8 character)
    logprob: float | None   # None: a text's first token, which nothing before it predicts


@dataclass(frozen=True)
class PositionLogprobs:
    """One position: the token there, then the most likely tokens (highest first)."""

    chosen: Logprob
    top: tuple[Logprob, ...] = ()

    @staticmethod
    def from_native(p) -> PositionLogprobs:
        return PositionLogprobs(_logprob(p.chosen), tuple(_logprob(t) for t in p.top))


def _logprob(t) -> Logprob:
    return Logprob(t.token, t.piece, float(t.logprob))


@dataclass(frozen=True)
class Token:
    """One generated token as it arrives."""

    id: int
    text: str
    metrics: TokenMetrics
    logits: bytes = b""  # raw float32 logits of this step, when requested
    logprobs: PositionLogprobs | None = None  # with Sampling(logprobs=N >= 0): from the logits the sampler saw


@dataclass
class Generation:
    """What one generation produced, complete once its iterator is exhausted."""

    prompt_tokens: list[int]
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    metrics: list[TokenMetrics] = field(default_factory=list)
    logits: list[bytes] = field(default_factory=list)
    stop_reason: str = ""  # "max_tokens", "end_of_generation", "context_full"
    reused_tokens: int = 0  # prompt tokens whose keys and values the context already held
    ttft_ms: float = 0.0    # from the call to the first token: tokenizing, restoring, the prompt's decode

    def add(self, token: Token, end_of_generation: bool, started: float, *, max_tokens: int,
            logits: bool = False) -> bool:
        """One step's token into the record (the one generation loop's bookkeeping, for a lone generation and
        for a slot alike): False once the generation is over, its stop_reason said."""
        if not self.metrics:
            self.ttft_ms = 1000 * (time.perf_counter() - started)
        self.metrics.append(token.metrics)
        if logits:
            self.logits.append(token.logits)
        if end_of_generation:
            self.stop_reason = "end_of_generation"
            return False
        self.tokens.append(token.id)
        self.text += token.text
        if len(self.tokens) >= max_tokens:
            self.stop_reason = "max_tokens"
            return False
        return True


class PieceText:
    """Each slot's bytes not yet text: a piece can end inside a multi-byte character, so text is emitted only
    once it decodes."""

    def __init__(self) -> None:
        self._pending: dict[int, bytes] = {}

    def start(self, slot: int = 0) -> None:
        self._pending[slot] = b""

    def feed(self, piece: bytes, slot: int = 0) -> str:
        pending = self._pending.get(slot, b"") + piece
        try:
            text, self._pending[slot] = pending.decode("utf-8"), b""
        except UnicodeDecodeError:
            text, self._pending[slot] = "", pending
        return text


def metrics_of(m: Any) -> Any:
    """The native TokenMetrics as the typed record."""
    return TokenMetrics(**{f.name: getattr(m, f.name) for f in fields(TokenMetrics)})


def token_of(result: Any, text: PieceText, slot: int = 0) -> Token:
    """A native StepResult as the token it hands out (an end of generation has no text)."""
    logprobs = PositionLogprobs.from_native(result.logprobs) if result.logprobs.chosen.token >= 0 else None
    piece = b"" if result.end_of_generation else result.piece
    return Token(result.token, text.feed(piece, slot), metrics_of(result.metrics), result.logits, logprobs)

