"""What a generation is made of: its sampling settings, each token with its step's metrics, and the
whole result. Plain data, below the engine (session) and the conversations on it (chat)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bmoe_edge.engine.settings import Sampling  # the sampling rows' record (declared with the engine's settings)

__all__ = ["Generation", "Logprob", "PositionLogprobs", "Sampling", "Token", "TokenMetrics"]


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
    rereads: int             # slices read again because the first read failed its checksum (--verify-slices)
    major_faults: int
    rss_bytes: int
    resident_expert_bytes: int
    cache_budget_bytes: int  # the budget after this step: it follows memory pressure
    pool_bytes: int          # memory the expert page pool holds
    drafted: int = 0         # speculative decoding: draft tokens decoded with this one
    accepted: int = 0        # ... that the model agreed with (the next tokens, without a decode)
    probed: int = 0          # a draft checked against this step's own token instead (drafts rejected outright)
    dropped: int = 0             # --drop-cold (lossy): routed slots skipped
    read_ahead: bool = False     # --prefetch: this step guessed each next layer's experts and read them ahead
    predicted: int = 0           # expert slots guessed ahead
    predicted_correct: int = 0   # ... that the router then chose
    ahead_bytes: int = 0         # bytes read for guesses
    ahead_wasted_bytes: int = 0  # ... for guesses the router did not choose
    net_bytes: int = 0       # RPC: bytes sent to and received from the workers in this step
    routed_bytes: int = 0    # bytes of the distinct experts this step routed to (each counted once)
    released_bytes: int = 0  # a prompt's step: compute-buffer memory given back to the cache after it


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
