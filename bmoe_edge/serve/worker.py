"""One engine: a bounded FIFO of jobs drained by the engine thread, each job's answer handed back to the event
loop piece by piece; a cancelled job stops between two tokens. At most --parallel N jobs run at once (one with
the default 1), each in its own thread and slot of the engine, their tokens decoded together by the engine
thread's one loop (serve/slots.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bmoe_edge.engine import chat, memlimits, tools
from bmoe_edge.engine.generation import Generation, Logprob, PositionLogprobs, Sampling
from bmoe_edge.engine.session import Engine, ScoringCancelled
from bmoe_edge.errors import BmoeError, RequestError
from bmoe_edge.serve import limits
from bmoe_edge.serve.slots import BatchStats, Scheduler, SlotEngine
from bmoe_edge.serve.stats import WATCHDOG_S, Progress, Stats


@dataclass(frozen=True)
class Request:
    """What to generate: a conversation (`messages`) or raw text (`prompt`)."""

    max_tokens: int
    sampling: Sampling
    stop: tuple[str, ...] = ()
    messages: tuple[chat.Message, ...] = ()
    prompt: str | None = None
    think: bool | None = None
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI's tools, rendered by the model's template (llama.cpp common)
    tool_choice: str = "none"  # "auto", "none", "required" or a function's name
    template_messages: tuple[dict[str, Any], ...] = ()  # the messages as the template takes them
    reasoning_effort: str | None = None  # gpt-oss's template switch (low, medium, high)
    json_schema: Any = None  # response_format: the answer follows this JSON schema
    continue_final: bool = False  # llama-server's continue_final_message: the last assistant message goes on
    parallel_tool_calls: bool = False  # OpenAI's: several calls in one answer (default here: one, then it ends)
    tenant: int = 0  # which API key sent it: the context's prefix is reused only for the same tenant
    echo: bool = False  # completions: the prompt comes back first (with its tokens' logprobs when asked)
    prompt_ids: tuple[int, ...] = ()  # completions: a prompt given as token ids (then `prompt` is "")


@dataclass(frozen=True)
class Prepared:
    """A request made ready for the engine, off the engine thread: everything that depends on the request alone
    (its checks, the chat template, the grammar, its token ids) is done, so what is left may fail only by the
    engine's own fault."""

    ids: tuple[int, ...]
    sampling: Sampling        # with the grammar a chat's format, a tool call or a response_format needs
    chat_prompt: Any = None   # a chat's rendered prompt (native ChatPrompt): how its answer is read


@dataclass(eq=False)   # a job is itself (the running ones are a set)
class Job:
    request: Request
    # ("delta", Delta) ... then ("done", Reply) or ("error", (http_status, message))
    deliver: Callable[[tuple[str, Any]], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    prepared: Prepared | None = None   # None: the engine thread prepares it first


ENGINE_FAILURES = 3   # the engine failing this many requests in a row: unhealthy, and the server restarts
class QueueFull(Exception):
    pass


class Unavailable(Exception):
    """The worker takes no more jobs: it is shutting down, or its thread is gone (the reason)."""


class _Killed(BaseException):
    """The test hook's way to end the engine thread as an unforeseen fault would."""


class Worker:
    """Owns the engine; `submit` from any thread, answers through each job's `deliver`."""

    def __init__(self, engine: Engine, *, queue_size: int = 8, template: str | None = None,
                 parse_special: bool = False, log: Callable[[str], None] | None = None) -> None:
        self.engine = engine
        self.log = log or _to_stderr
        self.template = chat.template_for(engine, template)
        self.parse_special = parse_special
        self.ctx = int(engine.run_info["ctx"])
        self.progress = Progress()
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.stats = Stats()
        self.batch = BatchStats()   # --parallel: slots, batches, union vs summed bytes, the worst gap
        self.parallel = engine.n_slots
        self._scheduler = Scheduler(engine, self.batch)
        self._stats_lock = threading.Lock()   # job threads add their replies
        self._by_tenant: dict[int, Stats] = {}   # each API key's own requests (/metrics with several keys)
        self.failure: str | None = None   # why the engine thread ended, if it did
        self.engine_failures = 0   # requests the engine failed in a row (a model file that changed fails each)
        self.last_engine_failure = ""
        self.closing = False
        self._running: set[Job] = set()
        self._warm = False   # the pool holds the pages the cache's budget allows (see _warm_a_little)
        self._trim = False   # an answer's freed heap is still to be given back (see _warm_a_little)
        self._thread = threading.Thread(target=self._run, name="bmoe-engine", daemon=True)
        self._thread.start()

    @property
    def queue_depth(self) -> int:
        return self.jobs.qsize()

    def has_room(self) -> bool:
        """The queue may take one more job (checked again when it is submitted)."""
        return not self.jobs.full()

    def stats_of(self, tenant: int) -> Stats:
        """One tenant's own counters, with the engine's shared gauges (memory, busy, the pool)."""
        with self._stats_lock:
            own = dataclasses.replace(self._by_tenant.get(tenant, Stats()))
        own.rss_bytes, own.busy = self.stats.rss_bytes, self.stats.busy
        own.pool_to_warm_bytes = self.stats.pool_to_warm_bytes
        return own

    def unavailable(self) -> str | None:
        """Why no job can be answered any more (None while it can): what /health reports."""
        if self.closing:
            return "shutting down"
        if self.failure is not None:
            return self.failure
        if not self._thread.is_alive():
            return "the engine thread is gone"
        if getattr(self.engine, "_native", True) is None:
            return "the engine is closed"
        if self.engine_failures >= ENGINE_FAILURES:   # why is in the log: /health answers without a key
            return f"the engine failed on {self.engine_failures} requests in a row"
        if self.progress.stalled():
            return f"the engine has made no progress for over {WATCHDOG_S:g} s"
        return None

    def submit(self, job: Job) -> None:
        reason = self.unavailable()
        if reason is not None:
            raise Unavailable(reason)
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        self._scheduler.wake()

    def fatal(self, line: str) -> None:
        """The engine's fatal error (bmoe::fatal_exit: a lost RPC worker, a decode past its deadline), heard
        on the failing thread before the process ends: /health says it, the running job and the queued
        ones are answered 503 with it, and the server exits non-zero (the service manager restarts it)."""
        self.failure = line.removeprefix("error: ")
        self._fail_running_and_queued(self.failure)

    def kill_for_test(self) -> None:
        """End the engine thread as an unforeseen fault would (the serve test hook)."""
        self.jobs.put(Job(Request(max_tokens=1, sampling=Sampling()), _kill))

    def close(self, timeout: float = 30) -> bool:
        """Stop taking jobs: the queued ones are answered 503 (cancelled), the running one stops between two
        tokens, and the engine thread is waited for. True when it ended within `timeout` (never blocks on a
        full queue)."""
        self.stop_taking_jobs()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def stop_taking_jobs(self) -> None:
        """The first half of close, without waiting: no new job, the queued ones answered 503, the running
        one cancelled."""
        self.closing = True
        for job in list(self._running):
            job.cancelled.set()
        self._fail_queued("shutting down")

    def _answered(self) -> None:
        """A job ran: once idle, the heap's freed memory goes back to the system first, then the pool warms up to
        the cache's new budget."""
        self._warm = False
        self._trim = True

    def _warm_a_little(self) -> None:
        """Idle: fault in the next piece of the memory the expert cache may fill (session.IDLE_WARM_STEP), so
        the next prompt's reads do not wait for the kernel to zero its pages (docs/memory.md). A failure only
        stops the warming: the prompt faults its pages in itself, and fails there if the memory is gone. After
        an answer, first the heap's free memory goes back (memlimits.release_free_heap: ~1 ms)."""
        if self._trim:
            self._trim = False
            memlimits.release_free_heap()
        try:
            self.stats.pool_to_warm_bytes = self.engine.warm_cache_memory()
        except BmoeError:
            self.stats.pool_to_warm_bytes = 0
        self._warm = self.stats.pool_to_warm_bytes == 0

    def _thread_ended(self) -> str:
        """The engine thread stops: why (a failure already said, else "ended" unless the server closes), and
        every running and queued job answered with it."""
        if self.failure is None and not self.closing:
            self.failure = "the engine thread ended"
        reason = self.unavailable() or "the engine thread ended"
        self._fail_running_and_queued(reason)
        return reason

    def _run(self) -> None:
        """The engine thread: admit queued jobs (FIFO) while fewer than --parallel run, each in a thread of its own,
        and step their slots together; idle, warm the cache's memory."""
        scheduler = self._scheduler
        try:
            while not self.closing:
                self._admit()
                if self._running:
                    self._answered()
                elif not self._warm:
                    self._warm_a_little()
                    continue
                scheduler.run_once(timeout=0.05)
        except BaseException as exc:
            self.failure = f"the engine thread failed ({type(exc).__name__})"
            raise
        finally:
            reason = self._thread_ended()
            scheduler.fail_all(BmoeError(f"the server cannot answer: {reason}"))

    def _runnable(self, job: Job) -> bool:
        """A job just taken from the queue runs now unless its client left meanwhile (counted); the test
        hook's kill job ends the engine thread."""
        if job.cancelled.is_set():
            self.stats.cancelled += 1
            return False
        if job.deliver is _kill:
            raise _Killed
        return True

    def _admit(self) -> None:
        while len(self._running) < self.parallel:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return
            if job is None:
                self.closing = True
                return
            if not self._runnable(job):
                continue
            self._running.add(job)
            self.stats.busy = True
            threading.Thread(target=self._serve_in_slot, args=(job,), name="bmoe-job", daemon=True).start()

    def _serve_in_slot(self, job: Job) -> None:
        try:
            self._serve(job, SlotEngine(self.engine, self._scheduler, job.request.tenant, job.cancelled))
        except Exception:  # delivering failed (the event loop is gone)
            self.stats.failures += 1
        finally:
            self._running.discard(job)
            self.stats.busy = bool(self._running)
            self._scheduler.wake()   # a queued job may take its place

    def _fail_running_and_queued(self, reason: str) -> None:
        """Answer the running jobs and every queued one 503 with `reason`: none of them will finish."""
        for current in list(self._running):
            current.cancelled.set()
            with contextlib.suppress(Exception):
                current.deliver(("error", (503, f"the server cannot answer: {reason}")))
        self._fail_queued(reason)

    def _fail_queued(self, reason: str) -> None:
        """Answer every job still queued: it will not run."""
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None and job.deliver is not _kill:
                job.cancelled.set()
                with contextlib.suppress(Exception):
                    job.deliver(("error", (503, f"the server cannot answer: {reason}")))

    def _serve(self, job: Job, engine: SlotEngine) -> None:
        """One job, in its slot. Whatever it raises becomes its own error and the next job runs: nothing a request
        does ends the thread. Which error is whose is decided here alone (`_failure`). The slot reuses a
        context's prefix only for the tenant that left it (the scheduler's)."""
        reply = chat.Reply()
        self.progress.started()
        answered = False   # counted as bmoe_requests_total, for the server and for its tenant alike
        try:
            prepared = job.prepared or self.prepare(job.request)
            answer = self._answer(job.request, prepared, reply, engine, job.cancelled)
            started, first = time.perf_counter(), True
            for delta in answer:
                self.progress.advanced()
                if first:
                    self.stats.last_ttft_seconds, first = time.perf_counter() - started, False
                if job.cancelled.is_set():
                    self.stats.cancelled += 1
                    job.deliver(("error", (503, "the server is shutting down") if self.closing
                                 else (499, "the request was cancelled")))
                    break
                job.deliver(("delta", delta))
            else:
                if job.cancelled.is_set():   # --parallel: a slot whose client left mid-prompt ends with no token
                    self.stats.cancelled += 1
                    job.deliver(("error", (499, "the request was cancelled")))
                    return
                job.deliver(("done", reply))
            self.stats.requests += 1
            answered = True
            self.engine_failures, self.last_engine_failure = 0, ""
        except Exception as exc:
            status, message = self._failure(exc)
            job.deliver(("error", (status, message)))
        finally:
            self.progress.ended()
            with self._stats_lock:
                self.stats.add(reply)
                own = self._by_tenant.setdefault(job.request.tenant, Stats())
                own.add(reply)
                own.requests += answered

    def _failure(self, exc: Exception) -> tuple[int, str]:
        """The one place that says whose fault an error is. The request's (RequestError: its schema, grammar,
        template, tools, parameters, a prompt that does not fit) is a 400 and counts for nothing. The engine's
        own (any other BmoeError: a read, the model file, a decode) is a 500 and counts toward the server's
        exit (ENGINE_FAILURES in a row). Anything else is a fault of ours on this request: a 500 that does not
        count. The client hears no file path or internal detail of a 500; the log has it."""
        if isinstance(exc, RequestError):
            return 400, str(exc)
        self.stats.failures += 1
        if isinstance(exc, BmoeError):
            self.engine_failures += 1
            self.last_engine_failure = str(exc)
            self.log(f"error: the engine failed a request: {exc}")
            return 500, "the engine failed on this request (the server's log says why)"
        self.log(f"error: the server failed a request: {type(exc).__name__}: {exc}")
        return 500, f"the server failed on this request ({type(exc).__name__})"

    def prepare(self, r: Request) -> Prepared:
        """Make `r` ready for the engine: its checks, the chat template (tools, response_format: the grammar),
        its token ids. Any thread: the app runs it off the event loop under a deadline, so the engine thread
        never does it; a failure is the request's own (RequestError)."""
        try:
            self._check_bias(r.sampling)
            self._check_window(r.sampling)
            if r.prompt is None:
                return self._prepare_chat(r)
            if r.prompt_ids:
                ids = list(r.prompt_ids)
            else:
                self._bounded(len(r.prompt.encode("utf-8")))
                ids = self.engine.tokenize(r.prompt, True, self.parse_special)
            if max(ids) >= self.engine.vocab_size:
                raise RequestError(f"the prompt has token id {max(ids)}, outside this model's vocabulary "
                                   f"(0 to {self.engine.vocab_size - 1})")
            self._fits(len(ids), r.max_tokens)
            if r.echo and r.sampling.logprobs >= 0 and len(ids) > limits.MAX_SCORED_TOKENS:
                raise RequestError(f"echo with logprobs scores at most {limits.MAX_SCORED_TOKENS} prompt tokens; "
                                   f"this prompt is {len(ids)}")
            sampling = r.sampling
            if r.json_schema is not None:   # no template: the schema's own grammar
                sampling = dataclasses.replace(sampling, grammar=chat.schema_grammar(r.json_schema))
            return Prepared(tuple(ids), sampling)
        except RequestError:
            raise
        except BmoeError as exc:
            raise RequestError(str(exc)) from None

    def _prepare_chat(self, r: Request) -> Prepared:
        """Rendered by the model's template through llama.cpp common: tools, earlier tool calls and results,
        a response_format, reasoning on or off, a reasoning effort; no user text may spell a control token."""
        if r.reasoning_effort and "reasoning_effort" not in self.template.source:
            raise RequestError("this model's chat template takes no reasoning_effort (gpt-oss's does)")
        messages = r.template_messages or tuple(m.openai() for m in r.messages)
        strings = tools.template_inputs(messages, r.tools)   # the messages' text included
        self._bounded(sum(len(text.encode("utf-8")) for _, text in strings))
        chat.check_strings(self.engine, strings, self.parse_special)
        turn = chat.Turn(tools=r.tools if r.tool_choice != "none" else (), tool_choice=r.tool_choice,
                         json_schema=r.json_schema, think=r.think, continue_final=r.continue_final,
                         parallel=r.parallel_tool_calls,
                         kwargs={"reasoning_effort": r.reasoning_effort} if r.reasoning_effort else {})
        prompt = chat.render(self.template, messages, turn)
        self._bounded(len(prompt.prompt.encode("utf-8")))
        ids = self.engine.tokenize(prompt.prompt, True, True)
        self._fits(len(ids), r.max_tokens)
        return Prepared(tuple(ids), chat.constrained(r.sampling, prompt), prompt)

    def _answer(self, r: Request, p: Prepared, reply: chat.Reply, engine: SlotEngine, cancelled: threading.Event):
        """The job's answer from its prepared form. It asks to reuse the context's prefix; the scheduler keeps one
        only in a slot the same tenant left (another tenant's prompt decodes afresh: neither cached_tokens nor
        timing tells one tenant what another asked)."""
        if p.chat_prompt is None:   # with the prepared sampling: a response_format's grammar is in it
            return _complete(engine, p.ids, dataclasses.replace(r, sampling=p.sampling), reply, True, cancelled)
        return chat.reply(engine, (), r.max_tokens, p.sampling, stop=r.stop, result=reply, prompt=p.chat_prompt,
                          prompt_ids=p.ids, reuse_kv=True, parallel=r.parallel_tool_calls)

    def _check_bias(self, sampling: Sampling) -> None:
        """logit_bias's token ids against this model's vocabulary: the request's 400 before anything runs."""
        if not sampling.logit_bias:
            return
        n_vocab = self.engine.vocab_size
        for item in sampling.logit_bias.split(","):
            if int(item.split(":")[0]) >= n_vocab:
                raise RequestError(f"logit_bias names token {item.split(':')[0]}, outside this model's vocabulary "
                                   f"(0 to {n_vocab - 1})")

    def _check_window(self, sampling: Sampling) -> None:
        """The penalty window is at most the context (its ring is allocated whole: 16 M entries would be 64 MB)."""
        if sampling.penalty_last_n > self.ctx:
            raise RequestError(f"'repeat_last_n' must be -1 (the whole context) or at most this server's context "
                               f"({self.ctx}), got {sampling.penalty_last_n}")

    @functools.cached_property
    def longest_piece(self) -> int:
        """The most bytes one token of this model's vocabulary stands for: a walk of the vocabulary (0.17 s for
        32k tokens here), made the first time a text is long enough to ask, not at every start."""
        return max((len(self.engine.token_piece(t)) for t in range(self.engine.vocab_size)), default=1) or 1

    def _bounded(self, n_bytes: int) -> None:
        """Text that cannot fit the context whatever its tokens are is refused before it is tokenized (a token is
        at most `longest_piece` bytes): a 4 MB message costs a comparison, not five tokenizations."""
        if n_bytes > self.ctx and n_bytes > self.ctx * self.longest_piece:
            raise RequestError(f"the prompt is {n_bytes} bytes of text: more than this server's context holds "
                               f"({self.ctx} tokens)")

    def _fits(self, n_prompt: int, max_tokens: int) -> None:
        if n_prompt >= self.ctx:
            raise RequestError(f"the prompt is {n_prompt} tokens; this server's context holds {self.ctx}")


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _kill(event: tuple[str, Any]) -> None:
    raise AssertionError("the test hook's job is never delivered to")


def _complete(engine: Engine | SlotEngine, ids: Sequence[int], r: Request, out: chat.Reply, reuse_kv: bool = True,
              cancelled: threading.Event | None = None):
    """Raw text completion: no template, no reasoning split; stop strings as in chat. With `echo` the prompt
    comes first, as one piece with its tokens' logprobs (one teacher-forced pass, stopped between its chunks
    when the client goes) when they are asked for."""
    out.prompt_tokens = len(ids)
    if r.echo:   # the prompt is the answer's start: Reply.content is the choice's whole text
        out.content = r.prompt or engine.text(list(ids))
        scored = _prompt_logprobs(engine, ids, r.sampling.logprobs, cancelled)
        if cancelled is not None and cancelled.is_set():
            return
        yield chat.Delta(out.content, "", None, (), scored)
    gen = Generation(list(ids))
    stops = chat.StopStrings(r.stop)
    for token in engine.generate(list(ids), r.max_tokens, r.sampling, result=gen, reuse_kv=reuse_kv):
        out.completion_tokens += 1
        out.metrics.append(token.metrics)
        text = stops.feed(token.text)
        out.content += text
        yield chat.Delta(text, "", token)
        if stops.stopped:
            break
    out.reused_tokens = gen.reused_tokens
    if not stops.stopped:
        tail = stops.flush()
        out.content += tail
        yield chat.Delta(tail, "", None)
    out.finish_reason = "stop" if stops.stopped or gen.stop_reason == "end_of_generation" else "length"


def _prompt_logprobs(engine: Engine | SlotEngine, ids: Sequence[int], n_top: int,
                     cancelled: threading.Event | None = None) -> tuple[PositionLogprobs, ...]:
    """Each prompt token's logprob after the ones before it (the first has none), from a teacher-forced pass
    decoded in batches and stopped between them once `cancelled` is set."""
    if n_top < 0:
        return ()
    stop = cancelled.is_set if cancelled is not None else None
    try:
        first = engine.score_positions(list(ids), n_top, cancelled=stop, batched=True) if len(ids) > 1 else []
    except ScoringCancelled:   # the client left: the caller sees `cancelled` set and ends the answer
        return ()
    piece = engine.token_piece(ids[0])
    return (PositionLogprobs(Logprob(ids[0], piece, None)), *first)


def loop_delivery(loop: asyncio.AbstractEventLoop, events: asyncio.Queue) -> Callable[[tuple[str, Any]], None]:
    """A `deliver` that hands each event to an asyncio queue on `loop` (thread-safe)."""
    return lambda event: loop.call_soon_threadsafe(events.put_nowait, event)


_ids = itertools.count(1)


def request_id(prefix: str) -> str:
    return f"{prefix}-{time.time_ns():x}{next(_ids):04x}"
