"""What the server reports of its engine: `Stats`, the counters and gauges /metrics gives (the whole server's,
and each API key's own), and `Progress`, whether the engine is inside a job and when it last advanced (what
/health says, and the watchdog)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bmoe_edge.engine import chat
from bmoe_edge.engine.generation import TokenMetrics


@dataclass
class Stats:
    """What /metrics reports; written by the worker thread only."""

    requests: int = 0
    failures: int = 0
    cancelled: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    completion_tokens: int = 0
    decode_seconds: float = 0.0
    last_tok_s: float = 0.0
    prompt_seconds: float = 0.0     # the prompts' decodes (what the context did not hold)
    prefill_bytes: int = 0          # bytes read while decoding prompts
    last_prompt_tok_s: float = 0.0
    last_ttft_seconds: float = 0.0  # from the engine taking the job to its first token
    bytes_read: int = 0
    stall_ms: float = 0.0
    cache_lookups: int = 0
    cache_hits: int = 0
    drafted: int = 0                # speculative decoding: draft tokens verified, and accepted
    accepted: int = 0
    rss_bytes: int = 0
    busy: bool = False
    pool_to_warm_bytes: int = 0     # what the idle steps have yet to fault in (0: warm, or not begun)

    def add(self, reply: chat.Reply) -> None:
        self.prompt_tokens += reply.prompt_tokens
        self.reused_tokens += reply.reused_tokens
        self.completion_tokens += reply.completion_tokens
        decode = reply.metrics[1:]  # the first step decodes the prompt
        if reply.metrics:
            first = reply.metrics[0]
            self.prompt_seconds += first.wall_ms / 1000
            self.prefill_bytes += first.bytes_read
            self.last_prompt_tok_s = 1000 * first.n_tokens / first.wall_ms if first.wall_ms > 0 else 0.0
        if decode:
            self.decode_seconds += sum(m.wall_ms for m in decode) / 1000
            self.last_tok_s = tok_s(decode)
        for m in reply.metrics:
            self._count(m)

    def _count(self, m: TokenMetrics) -> None:
        self.bytes_read += m.bytes_read
        self.stall_ms += m.stall_ms
        self.cache_lookups += m.cache_lookups
        self.cache_hits += m.cache_hits
        self.drafted += m.drafted
        self.accepted += m.accepted
        self.rss_bytes = m.rss_bytes


def tok_s(decode: Sequence[TokenMetrics]) -> float:
    """Decode speed: steps (after the prompt's) per second of their wall time."""
    ms = sum(m.wall_ms for m in decode)
    return 1000 * len(decode) / ms if ms > 0 else 0.0


# A request's `streamer_stats: true` (params.STREAMER_STATS): what the streamer did, each step (a streamed
# chunk carries the steps of the tokens it carries) and for the whole answer (the last chunk, or the answer's
# body). The field names are the engine's TokenMetrics rows (native/include/bmoe/metrics.h).
STEP_FIELDS = ("step", "n_tokens", "wall_ms", "stall_ms", "bytes_read", "cache_hits", "cache_lookups")


def step(m: TokenMetrics) -> dict[str, Any]:
    return {name: round(v, 3) if isinstance(v := getattr(m, name), float) else v for name in STEP_FIELDS}


def answer(reply: chat.Reply) -> dict[str, Any]:
    """One answer's view of the streamer: its prompt's step (the engine's time to the first token) apart from
    the decode steps after it (speed, reads per token, expert cache hits, time compute waited for reads)."""
    if not reply.metrics:
        return {"tokens": 0}
    prompt, decode = reply.metrics[0], reply.metrics[1:]
    lookups = sum(m.cache_lookups for m in decode)
    read = sum(m.bytes_read for m in decode)
    last = reply.metrics[-1]
    return {"tokens": reply.completion_tokens, "tok_s": round(tok_s(decode), 3),
            "ttft_ms": round(prompt.wall_ms, 3), "prompt_tokens_decoded": prompt.n_tokens,
            "prefill_mb": round(prompt.bytes_read / 1e6, 3),
            "mb_per_token": round(read / 1e6 / len(decode), 4) if decode else 0.0,
            "hit_rate": round(sum(m.cache_hits for m in decode) / lookups, 4) if lookups else None,
            "stall_ms": round(sum(m.stall_ms for m in decode), 3),
            "cache_budget_mb": round(last.cache_budget_bytes / (1 << 20), 1),
            "rss_mb": round(last.rss_bytes / (1 << 20), 1)}


# No token, no prompt chunk, no answer's end for this long while a job runs: the engine thread is stuck (a native
# call that never returns; a hung read ends at the engine's own I/O deadline first). /health says so and the
# server exits for the service manager to restart it. Far above any one native call a board makes (a prompt's
# decode at a microSD card's speed), so it never ends a slow answer.
WATCHDOG_S = 1800.0


class Progress:
    """Whether the engine is inside a job, since when, and when it last advanced: what /health reports, and
    the watchdog. Written by the threads that run jobs, read by any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.since = self.last = time.monotonic()

    def started(self) -> None:
        with self._lock:
            now = time.monotonic()
            if self.running == 0:
                self.since = now
            self.running += 1
            self.last = now

    def advanced(self) -> None:
        self.last = time.monotonic()

    def ended(self) -> None:
        with self._lock:
            self.running -= 1
            self.last = time.monotonic()

    def report(self) -> dict[str, Any]:
        now = time.monotonic()
        if not self.running:
            return {"busy": False}
        return {"busy": True, "job_age_s": round(now - self.since, 1), "since_progress_s": round(now - self.last, 1)}

    def stalled(self) -> bool:
        return self.running > 0 and time.monotonic() - self.last > WATCHDOG_S
