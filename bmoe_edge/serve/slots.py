"""serve's engine thread and its one loop, for --parallel N slots (1 by default). Requests run in job threads
(rendering, stop strings, tool calls: what they do alone); each one's generation is a slot of the engine. The
engine thread alone calls the engine: it begins the slots asked for (FIFO; with one slot a longer prefix the
prompt cache holds restored first), steps every active slot in one batched decode, and hands each slot's token
to its job. A job that ends (its answer complete, its client gone) releases its slot, which stops before the
next step."""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from bmoe_edge.engine.batching import StepInfo, step
from bmoe_edge.engine.generation import Generation, PieceText, Sampling, Token
from bmoe_edge.engine.session import Engine
from bmoe_edge.errors import BmoeError


@dataclass
class BatchStats:
    """What /metrics says of the batches; written by the engine thread only."""

    slots: int = 1
    slots_busy: int = 0
    steps: int = 0
    batch_tokens: int = 0        # tokens of all steps (per step: batch_tokens / steps)
    last_batch_sequences: int = 0
    max_batch_sequences: int = 0
    union_bytes: int = 0         # decode-only steps: the distinct experts each batch routed to ...
    summed_bytes: int = 0        # ... and what its sequences route to each alone
    bytes_read: int = 0          # every batched step's reads, once (a request's own metrics are its steps',
    decode_bytes_read: int = 0   # shared with the others in them); ... of the decode-only steps
    worst_gap_seconds: float = 0.0   # the longest wait of any stream between two of its tokens
    last_gap_seconds: float = 0.0    # ... the longest in the last step


@dataclass
class _Stream:
    """One generation: the begin asked for, then its tokens, from the engine thread to its job."""

    ids: list[int]
    sampling: Sampling
    tenant: int
    reuse_kv: bool
    max_tokens: int
    cancelled: threading.Event | None = None   # the job's: its client went away (checked every step)
    events: queue.Queue = field(default_factory=queue.Queue)
    slot: int = -1
    produced: int = 0
    last_token: float = 0.0
    released: bool = False


class Scheduler:
    def __init__(self, engine: Engine, stats: BatchStats) -> None:
        self.engine = engine
        self.n = engine.n_slots
        self.stats = stats
        stats.slots = self.n
        self._cv = threading.Condition()
        self._begins: collections.deque[_Stream] = collections.deque()
        self._exclusive: collections.deque[tuple[Callable[[], Any], queue.Queue]] = collections.deque()
        self._released: list[_Stream] = []
        self._streams: list[_Stream | None] = [None] * self.n
        self._tenant: list[int | None] = [None] * self.n   # whose context each slot holds
        self._text = PieceText()
        self._woken = False   # wake() since the last run_once: the wait would miss it

    # --- job threads -------------------------------------------------------------------------------------------

    def generate(self, tenant: int, ids: Sequence[int], max_tokens: int, sampling: Sampling,
                 result: Generation, reuse_kv: bool, cancelled: threading.Event | None = None) -> Iterator[Token]:
        """`Engine.generate`'s tokens, from a slot stepped with the others."""
        started = time.perf_counter()
        if max_tokens <= 0:
            result.stop_reason = "max_tokens"
            return
        stream = _Stream(list(ids), sampling, tenant, reuse_kv, max_tokens, cancelled)
        result.prompt_tokens = stream.ids
        with self._cv:
            self._begins.append(stream)
            self._cv.notify()
        try:
            result.reused_tokens = self._take(stream)
            while True:
                event = self._take(stream)
                if event in ("max_tokens", "context_full", "cancelled"):
                    result.stop_reason = event
                    return
                token, end = event
                going_on = result.add(token, end, started, max_tokens=max_tokens)
                if not end:
                    yield token
                if not going_on:
                    return
        finally:
            with self._cv:
                stream.released = True
                self._released.append(stream)
                self._cv.notify()

    def wake(self) -> None:
        """Something for the engine thread outside the scheduler (a job queued, a job thread ended)."""
        with self._cv:
            self._woken = True
            self._cv.notify()

    def exclusive(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the engine thread once no slot is active (a pass that clears the context: scoring)."""
        answer: queue.Queue = queue.Queue()
        with self._cv:
            self._exclusive.append((fn, answer))
            self._cv.notify()
        result = answer.get()
        if isinstance(result, BaseException):
            raise result
        return result[0]

    @staticmethod
    def _take(stream: _Stream) -> Any:
        event = stream.events.get()
        if isinstance(event, BaseException):
            raise event
        return event

    # --- the engine thread -------------------------------------------------------------------------------------

    def run_once(self, timeout: float) -> None:
        """Stop the released slots, begin the asked-for ones, and step: one batched decode."""
        with self._cv:
            if not (self._begins or self._released or self._exclusive or self._woken or self._active()):
                self._cv.wait(timeout)
            released, self._released, self._woken = self._released, [], False
        for stream in released:
            self._stop(stream)
        for stream in list(self._streams):   # a client gone mid-prompt: its slot now, not after the prompt
            if stream is not None and stream.cancelled is not None and stream.cancelled.is_set():
                self._stop(stream)
                stream.events.put("cancelled")
        self._run_exclusive()
        self._begin_waiting()
        self.stats.slots_busy = len(self._active())
        if self._active():
            self._step()

    def fail_all(self, error: BaseException) -> None:
        """The engine thread ends: every generation waiting on it hears why."""
        with self._cv:
            waiting = [*self._begins, *(s for s in self._streams if s is not None)]
            self._begins.clear()
            exclusive = list(self._exclusive)
            self._exclusive.clear()
        for stream in waiting:
            stream.events.put(error)
        for _, answer in exclusive:
            answer.put(error)

    def _prompt_cache(self) -> Any:
        """The engine's prompt cache, with one slot only: its state files hold one conversation."""
        return self.engine.prompt_cache if self.n == 1 else None

    def _active(self) -> list[int]:
        return [i for i, s in enumerate(self._streams) if s is not None]

    def _stop(self, stream: _Stream) -> None:
        if stream.slot >= 0 and self._streams[stream.slot] is stream:
            self._streams[stream.slot] = None
            self.engine.slot_stop(stream.slot)

    def _run_exclusive(self) -> None:
        while self._exclusive and not self._active():
            with self._cv:
                fn, answer = self._exclusive.popleft()
            try:
                answer.put((fn(),))
            except Exception as exc:  # the job's own error, raised in its thread
                answer.put(exc)
            self._tenant = [None] * self.n   # the pass cleared every slot's context

    def _begin_waiting(self) -> None:
        while self._begins and not self._exclusive and None in self._streams:
            with self._cv:
                stream = self._begins.popleft()
            if stream.released:
                continue
            slot = self._pick(stream)
            reuse = stream.reuse_kv and self._tenant[slot] == stream.tenant
            try:
                cache = self._prompt_cache()
                if cache is not None:   # a longer prefix it holds for this tenant is restored first
                    reuse = cache.restore_before(self.engine, stream.ids, stream.tenant, reuse)
                reused = self.engine.slot_begin(slot, stream.ids, stream.sampling, reuse_kv=reuse)
            except BmoeError as exc:   # the request's own (a grammar, a bias): its 400
                stream.events.put(exc)
                continue
            self._tenant[slot] = stream.tenant
            stream.slot, stream.last_token = slot, time.perf_counter()
            self._streams[slot] = stream
            self._text.start(slot)
            stream.events.put(reused)

    def _pick(self, stream: _Stream) -> int:
        """The free slot holding the longest prefix of this tenant's prompt (a returning conversation), else
        the lowest free one (the batch's sequences contiguous: llama.cpp decodes them in one ubatch)."""
        free = [i for i, s in enumerate(self._streams) if s is None]
        best, best_len = free[0], 0
        for slot in free:
            if self._tenant[slot] != stream.tenant:
                continue
            held = self.engine.slot_tokens(slot)
            n = 0
            while n < len(held) and n < len(stream.ids) and held[n] == stream.ids[n]:
                n += 1
            if n > best_len:
                best, best_len = slot, n
        return best

    def _step(self) -> None:
        try:
            events, info = step(self.engine, self._text)
        except BmoeError as exc:   # a failed decode ends every slot's generation (the engine cleared them)
            for slot in self._active():
                stream = self._streams[slot]
                self._streams[slot], self._tenant[slot] = None, None
                if stream is not None:
                    stream.events.put(BmoeError(str(exc)))
            return
        if info is not None:
            self._count(info)
        now, gap = time.perf_counter(), 0.0
        for e in events:
            stream = self._streams[e.slot]
            if stream is None:
                continue
            if e.context_full:
                self._streams[e.slot] = None
                stream.events.put("context_full")
                continue
            if e.token is None:
                continue
            if stream.produced:
                gap = max(gap, now - stream.last_token)
            elif info is not None and (cache := self._prompt_cache()) is not None:
                cache.store_after_prompt(self.engine, stream.ids, stream.tenant, info.n_tokens)
            stream.produced += 1
            stream.last_token = now
            stream.events.put((e.token, e.end_of_generation))
            if e.end_of_generation:
                self._streams[e.slot] = None   # the engine stopped the slot itself
            elif stream.produced >= stream.max_tokens:
                stream.events.put("max_tokens")
                self._stop(stream)
        self.stats.last_gap_seconds = gap
        self.stats.worst_gap_seconds = max(self.stats.worst_gap_seconds, gap)

    def _count(self, info: StepInfo) -> None:
        s = self.stats
        s.steps += 1
        s.batch_tokens += info.n_tokens
        s.last_batch_sequences = info.n_sequences
        s.max_batch_sequences = max(s.max_batch_sequences, info.n_sequences)
        s.bytes_read += info.bytes_read
        if info.n_decoding == info.n_sequences:
            s.decode_bytes_read += info.bytes_read
        if info.summed_bytes:
            s.union_bytes += info.union_bytes
            s.summed_bytes += info.summed_bytes


class SlotEngine:
    """What a job's answer sees as its engine: the server's engine, with generation (and scoring, which clears
    the context) going through the scheduler."""

    def __init__(self, engine: Engine, scheduler: Scheduler, tenant: int,
                 cancelled: threading.Event | None = None) -> None:
        self._engine = engine
        self._scheduler = scheduler
        self._tenant = tenant
        self._cancelled = cancelled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def generate(self, prompt: Sequence[int], max_tokens: int, sampling: Sampling | None = None, *,
                 result: Generation | None = None, reuse_kv: bool = False, **_: Any) -> Iterator[Token]:
        out = result if result is not None else Generation(list(prompt))
        return self._scheduler.generate(self._tenant, prompt, max_tokens, sampling or Sampling(), out, reuse_kv,
                                        self._cancelled)

    def score_positions(self, tokens: list[int], n_top: int = 0, **how: Any) -> Any:
        return self._scheduler.exclusive(lambda: self._engine.score_positions(tokens, n_top, **how))

    def score(self, tokens: list[int]) -> Any:
        return self._scheduler.exclusive(lambda: self._engine.score(tokens))

