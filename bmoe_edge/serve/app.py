"""The HTTP face: Starlette routes over one `Worker`. Requests queue in the worker's bounded FIFO (full:
429 with Retry-After); a client that goes away cancels its generation; with an API key every route
but /health needs `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`). Four APIs share the one
pipeline: OpenAI's Chat Completions and Completions, Anthropic's Messages and OpenAI's Responses (the last two
translated into a chat request: anthropic_api.py, responses_api.py), each written back in its own shape."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from bmoe_edge.engine import chat, native
from bmoe_edge.engine.generation import PositionLogprobs
from bmoe_edge.errors import RequestError
from bmoe_edge.serve import anthropic_api, limits, metrics, openai_api, params, responses_api, stats, ui
from bmoe_edge.serve.api_errors import ApiError
from bmoe_edge.serve.gate import Gate
from bmoe_edge.serve.worker import Job, Prepared, QueueFull, Request, Unavailable, Worker, loop_delivery, request_id

TEST_HOOKS = "BMOE_EDGE_SERVE_TEST_HOOKS"   # "1" in a test build (build_info().test_faults): the /_test/ routes
RETRY_AFTER_S = 2
DONE = "data: [DONE]\n\n"   # the end of a Chat Completions or Completions stream
PREPARE_THREADS = 2   # requests rendered, converted and tokenized at once, off the event loop
PREPARING_MAX = 4 * PREPARE_THREADS   # ... and waiting for a thread: past it, a 429 (as a full queue)


def _error(exc: ApiError, path: str) -> JSONResponse:
    """The error in the shape of the API whose route `path` is (api_errors.py)."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 429 else None
    return JSONResponse(exc.body_for(path), status_code=exc.status, headers=headers)


Body = dict[str, Any]


@dataclass(frozen=True)
class Frames:
    """How one API writes an answer as server-sent events: the events before the first piece, those of each piece,
    those of the whole answer, and those of a failure mid-answer (each a JSON body, possibly none)."""

    head: list[Body]
    chunk: Callable[[chat.Delta], list[Body]]
    last: Callable[[chat.Reply], list[Body]]
    failed: Callable[[int, str], list[Body]]
    named: bool = False   # each event named by its body's type ("event: TYPE"): Anthropic's and the Responses API's
    done: str = ""        # what ends a complete stream: Chat Completions' "data: [DONE]"

    @classmethod
    def of(cls, stream: anthropic_api.MessageStream | responses_api.ResponseStream) -> Frames:
        return cls(stream.head(), stream.chunk, stream.last, stream.failed, named=True)

    def event(self, body: Body) -> str:
        return (f"event: {body['type']}\n" if self.named else "") + f"data: {json.dumps(body)}\n\n"


def _openai_failure(status: int, message: str) -> list[Body]:
    return [ApiError(status, message, type="server_error").body()]


async def _body(request: HttpRequest, timeout_s: float = limits.BODY_TIMEOUT_S) -> Any:
    """The request's JSON body: at most limits.MAX_BODY_BYTES, read within `timeout_s` (a client that trickles
    its body is a 408, not a connection held open), checked by check_json."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is over {limits.MAX_BODY_BYTES >> 20} MiB")

    async def read() -> bytes:
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limits.MAX_BODY_BYTES:
                raise ApiError(413, f"the request body is over {limits.MAX_BODY_BYTES >> 20} MiB")
        return bytes(raw)

    try:
        raw = await asyncio.wait_for(read(), timeout_s)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s", code="body_timeout") from None
    try:
        body = json.loads(raw)
    except ValueError as exc:   # also bytes that are not UTF-8
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, f"the request body nests deeper than {limits.MAX_DEPTH} levels") from None
    check_json(body)
    return body


def check_json(body: Any) -> None:
    """Refuse what JSON allows and nothing after this may meet: a string that is not Unicode text (a lone
    surrogate such as "\\ud800" parses, but cannot be encoded), nesting deeper than limits.MAX_DEPTH, or more values
    than MAX_JSON_VALUES (held as Python objects while the request waits: ~50 bytes of body, ~1 KB held)."""
    todo: list[tuple[Any, int]] = [(body, 1)]
    seen = 0
    while todo:
        value, depth = todo.pop()
        seen += 1
        if seen > limits.MAX_JSON_VALUES:
            raise ApiError(400, f"the request body has more than {limits.MAX_JSON_VALUES} values")
        if isinstance(value, str):
            _text(value)
        elif isinstance(value, dict | list):
            if depth > limits.MAX_DEPTH:
                raise ApiError(400, f"the request body nests deeper than {limits.MAX_DEPTH} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    _text(key)
                    todo.append((item, depth + 1))
            else:
                todo.extend((item, depth + 1) for item in value)


def _text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "the request body has a string that is not valid Unicode text (a lone surrogate "
                       "escape such as \\ud800)") from None


@contextlib.contextmanager
def _cancelled_unless_answered(job: Job) -> Iterator[None]:
    """A handler that leaves by an error (its task cancelled, the client gone, a fault) cancels its job:
    a queued job is skipped, a running one stops between two tokens."""
    try:
        yield
    except BaseException:
        job.cancelled.set()
        raise


class _JobStream(StreamingResponse):
    """Server-sent events whose job is cancelled however the response ends (also when the stream never
    started: the client went away first)."""

    def __init__(self, job: Job, content: AsyncIterator[str]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self.job = job

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancelled.set()


async def _until_disconnect(request: HttpRequest) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Server:
    def __init__(self, worker: Worker, model_id: str, api_keys: Sequence[str] = (),
                 body_timeout_s: float = limits.BODY_TIMEOUT_S) -> None:
        self.worker = worker
        self.body_timeout_s = body_timeout_s
        self.model_id = model_id
        self.api_keys = tuple(f"Bearer {k}".encode() for k in api_keys)
        self.created = int(time.time())
        self.rejected = 0
        self.preparer = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="bmoe-prepare")
        self.preparing = 0   # requests handed to the preparer, not yet back
        self.stored = responses_api.ResponseStore(max(1, len(self.api_keys)))   # previous_response_id's

    def tenant(self, request: HttpRequest) -> int | None:
        """Which key the request carries (its index: the tenant), 0 when the server has none; None when
        it carries no valid key. The key is `Authorization: Bearer KEY` or Anthropic's `x-api-key: KEY`; every
        key is compared with each, in constant time."""
        if not self.api_keys:
            return 0
        offered = [request.headers.get("authorization", "")]
        if "x-api-key" in request.headers:
            offered.append(f"Bearer {request.headers['x-api-key']}")
        found = None
        for given in offered:
            for i, key in enumerate(self.api_keys):
                if hmac.compare_digest(given.encode("utf-8", "surrogateescape"), key) and found is None:
                    found = i
        return found

    def _authorized(self, request: HttpRequest) -> bool:
        return self.tenant(request) is not None

    def _busy(self) -> ApiError:
        self.rejected += 1
        return ApiError(429, "the server is busy: its queue is full, retry later", type="rate_limit_error",
                        code="queue_full")

    async def _prepare(self, req: Request, queued: bool = True) -> Prepared:
        """The request made ready for the engine (its template, grammar and tokens) on a preparer thread, off
        the event loop and never on the engine thread, within PREPARE_DEADLINE_S; a full queue is refused
        before any of it runs (unless the request is not to be `queued`: count_tokens)."""
        if (queued and not self.worker.has_room()) or self.preparing >= PREPARING_MAX:
            raise self._busy()
        self.preparing += 1
        try:
            work = asyncio.get_running_loop().run_in_executor(self.preparer, self.worker.prepare, req)
            return await asyncio.wait_for(asyncio.shield(work), limits.PREPARE_DEADLINE_S)
        except TimeoutError:
            raise ApiError(400, f"the request could not be prepared within {limits.PREPARE_DEADLINE_S:g} s: its "
                           "schema, tools or conversation are too large", code="too_complex") from None
        except RequestError as exc:
            raise ApiError(400, str(exc)) from None
        finally:
            self.preparing -= 1

    def _enqueue(self, req: Request, prepared: Prepared, request: HttpRequest) -> tuple[Job, asyncio.Queue]:
        events: asyncio.Queue = asyncio.Queue()
        job = Job(req, loop_delivery(asyncio.get_running_loop(), events), prepared=prepared)
        try:
            self.worker.submit(job)
        except Unavailable as exc:
            raise ApiError(503, f"the server cannot answer: {exc}", type="server_error",
                           code="unavailable") from None
        except QueueFull:
            raise self._busy() from None
        return job, events

    async def _job(self, req: Request, request: HttpRequest) -> tuple[Job, asyncio.Queue]:
        """Prepared, then queued. Each key is a tenant: the context (and the prompt prefix it holds) is reused
        only for the same one."""
        req = dataclasses.replace(req, tenant=self.tenant(request) or 0)
        return self._enqueue(req, await self._prepare(req), request)

    async def _next_event(self, request: HttpRequest, job: Job, events: asyncio.Queue) -> tuple[str, Any]:
        """The worker's next event; a client that hangs up meanwhile cancels the job."""
        gone = asyncio.ensure_future(_until_disconnect(request))
        got = asyncio.ensure_future(events.get())
        try:
            await asyncio.wait({got, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not got.done():
            got.cancel()
            job.cancelled.set()
            raise ApiError(499, "the client closed the request")
        kind, value = got.result()
        if kind == "error":
            status, message = value
            raise ApiError(status, message, type="server_error" if status >= 500 else "invalid_request_error")
        return kind, value

    async def _result(self, request: HttpRequest, job: Job,
                      events: asyncio.Queue) -> tuple[chat.Reply, list[PositionLogprobs]]:
        """Wait for the whole answer; with it, its pieces' logprobs (when asked for), in order."""
        found: list[PositionLogprobs] = []
        while True:
            kind, value = await self._next_event(request, job, events)
            if kind == "done":
                return value, found
            found.extend(openai_api.positions(value))

    async def _stream(self, job: Job, events: asyncio.Queue, pending: tuple[str, Any],
                      frames: Frames) -> AsyncIterator[str]:
        """Server-sent events from the first event on (already taken, so a bad request was a 4xx)."""
        try:
            for body in frames.head:
                yield frames.event(body)
            kind, value = pending
            while True:
                if kind == "delta":
                    for body in frames.chunk(value):
                        yield frames.event(body)
                elif kind == "done":
                    for body in frames.last(value):
                        yield frames.event(body)
                    if frames.done:
                        yield frames.done
                    return
                else:
                    for body in frames.failed(*value):
                        yield frames.event(body)
                    return
                kind, value = await events.get()
        finally:
            job.cancelled.set()  # a no-op when done; stops the engine when the client went away

    async def _streamed(self, request: HttpRequest, job: Job, events: asyncio.Queue, frames: Frames) -> Response:
        pending = await self._next_event(request, job, events)
        return _JobStream(job, self._stream(job, events, pending, frames))

    async def chat_completions(self, request: HttpRequest) -> Response:
        body = await _body(request, self.body_timeout_s)
        req = openai_api.parse_chat(body, self.model_id)
        stream, with_usage = bool(body.get("stream")), openai_api.include_usage(body)
        telemetry = openai_api.streamer_stats(body)
        del body   # what the job needs is in `req`: the body's objects go now, not after its answer
        job, events = await self._job(req, request)
        with _cancelled_unless_answered(job):
            rid = request_id("chatcmpl")
            wanted = req.sampling.logprobs >= 0
            if not stream:
                reply, found = await self._result(request, job, events)
                whole = openai_api.chat_completion(rid, self.model_id, reply, found if wanted else None)
                return JSONResponse(whole | ({"streamer": {"answer": stats.answer(reply)}} if telemetry else {}))

            held: list[PositionLogprobs] = []   # logprobs of text still held back: they go with the next chunk
            steps: list[Body] = []   # streamer_stats: the steps of the tokens since the last chunk

            def chunk(d: chat.Delta) -> list[Body]:
                fields = openai_api.delta_fields(d)
                held.extend(openai_api.positions(d))
                if telemetry and d.token is not None:
                    steps.append(stats.step(d.token.metrics))
                if not fields:
                    return []
                out = openai_api.chat_chunk(rid, self.model_id, fields, logprobs=held[:] if wanted else None)
                held.clear()
                if telemetry:
                    out["streamer"] = {"steps": steps[:]}
                    steps.clear()
                return [out]

            def last(reply: chat.Reply) -> list[dict[str, Any]]:
                out = [openai_api.chat_chunk(rid, self.model_id, {}, reply.finish_reason, held[:] if held else None)]
                if telemetry:
                    out[0]["streamer"] = {"steps": steps[:], "answer": stats.answer(reply)}
                if with_usage:
                    out.append(openai_api.envelope("chat.completion.chunk", rid, self.model_id)
                               | {"choices": [], "usage": openai_api.usage(reply)})
                return out

            head = [openai_api.chat_chunk(rid, self.model_id, {"role": "assistant", "content": ""})]
            return await self._streamed(request, job, events, Frames(head, chunk, last, _openai_failure,
                                                                     done=DONE))

    async def completions(self, request: HttpRequest) -> Response:
        body = await _body(request, self.body_timeout_s)
        req = openai_api.parse_completion(body, self.model_id)
        stream = bool(body.get("stream"))
        del body
        job, events = await self._job(req, request)
        with _cancelled_unless_answered(job):
            rid = request_id("cmpl")
            wanted = req.sampling.logprobs >= 0
            if not stream:
                reply, found = await self._result(request, job, events)
                return JSONResponse(openai_api.text_completion(rid, self.model_id, reply, found if wanted else None))
            held: list[PositionLogprobs] = []   # logprobs of text still held back: they go with the next chunk
            offset = [0]   # where the next chunk's text starts in the whole text (text_offset)

            def logprobs() -> dict[str, Any] | None:
                out = openai_api.completion_logprobs(held, offset[0]) if wanted and held else None
                offset[0] += sum(len(t) for t in out["tokens"]) if out else 0
                held.clear()
                return out

            def chunk(d: chat.Delta) -> list[Body]:
                held.extend(openai_api.positions(d))
                return [openai_api.text_chunk(rid, self.model_id, d.content, None, logprobs())] if d.content else []

            def last(reply: chat.Reply) -> list[dict[str, Any]]:
                return [openai_api.text_chunk(rid, self.model_id, "", reply.finish_reason, logprobs())]

            return await self._streamed(request, job, events, Frames([], chunk, last, _openai_failure, done=DONE))

    async def messages(self, request: HttpRequest) -> Response:
        """Anthropic's Messages API, on the same pipeline (anthropic_api.py)."""
        body = await _body(request, self.body_timeout_s)
        req = anthropic_api.parse(body, self.model_id)
        stream = bool(body.get("stream"))
        del body
        job, events = await self._job(req, request)
        with _cancelled_unless_answered(job):
            rid = request_id("msg")
            if not stream:
                reply, _ = await self._result(request, job, events)
                return JSONResponse(anthropic_api.message(rid, self.model_id, reply))
            assert job.prepared is not None
            frames = Frames.of(anthropic_api.MessageStream(rid, self.model_id, len(job.prepared.ids)))
            return await self._streamed(request, job, events, frames)

    async def count_tokens(self, request: HttpRequest) -> Response:
        """The prompt a Messages request would decode, prepared as for an answer (the same template and tokens)
        and counted; nothing is queued."""
        body = await _body(request, self.body_timeout_s)
        req = anthropic_api.parse(body, self.model_id, "count_tokens")
        del body
        req = dataclasses.replace(req, tenant=self.tenant(request) or 0)
        prepared = await self._prepare(req, queued=False)
        return JSONResponse({"input_tokens": len(prepared.ids)})

    async def responses(self, request: HttpRequest) -> Response:
        """OpenAI's Responses API, on the same pipeline (responses_api.py); a stored response's conversation is
        continued only by the API key that made it."""
        tenant = self.tenant(request) or 0
        body = await _body(request, self.body_timeout_s)
        req, conversation = responses_api.parse(body, self.model_id, lambda rid: self.stored.get(tenant, rid))
        stream, store, echoed = bool(body.get("stream")), body.get("store", True), responses_api.echo(body)
        del body
        job, events = await self._job(req, request)
        with _cancelled_unless_answered(job):
            rid = request_id("resp")
            wanted = req.sampling.logprobs >= 0

            def keep(reply: chat.Reply) -> None:
                if store:
                    self.stored.put(tenant, rid, [*conversation, responses_api.answer_turn(reply)])

            if not stream:
                reply, found = await self._result(request, job, events)
                keep(reply)
                output = responses_api.output(reply, found if wanted else None)
                return JSONResponse(responses_api.response(rid, self.model_id, echoed, output, reply))
            frames = Frames.of(responses_api.ResponseStream(rid, self.model_id, echoed, wanted, keep))
            return await self._streamed(request, job, events, frames)

    async def models(self, request: HttpRequest) -> Response:
        return JSONResponse(openai_api.models(self.model_id, self.created))

    async def health(self, request: HttpRequest) -> Response:
        """200 while a request can be answered; 503 with the reason when not (the engine thread is gone,
        the engine failed, or the server is shutting down)."""
        reason = self.worker.unavailable()
        if reason is not None:
            return JSONResponse({"status": "unavailable", "reason": reason, "model": self.model_id},
                                status_code=503)
        return JSONResponse({"status": "ok", "model": self.model_id, "queue_depth": self.worker.queue_depth}
                            | self.worker.progress.report())

    async def kill_worker(self, request: HttpRequest) -> Response:
        """The test hook (BMOE_EDGE_SERVE_TEST_HOOKS=1): the engine thread ends as an unforeseen fault would."""
        self.worker.kill_for_test()
        return JSONResponse({"status": "killing"})

    async def metrics(self, request: HttpRequest) -> Response:
        """With several keys each tenant sees its own requests' counters (and no batch rows, whose token counts
        are everyone's): one tenant must not learn what another asked."""
        tenant, shared = self.tenant(request) or 0, len(self.api_keys) > 1
        stats = self.worker.stats_of(tenant) if shared else self.worker.stats
        text = metrics.prometheus(stats, self.worker.queue_depth, self.rejected, None if shared else self.worker.batch)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


# The server's own routes besides the APIs' (params.PATHS, POST) and the chat page's files (ui.routes(), GET):
# path -> the Server method answering GET there, and whether it is public (no key needed).
OWN_ROUTES: dict[str, tuple[str, bool]] = {"/health": ("health", True), "/metrics": ("metrics", False),
                                           "/v1/models": ("models", False)}


def paths(with_ui: bool = True) -> dict[str, str]:
    """Every path create_app routes and its method: the HTTP fuzz campaign draws its requests from these, so a
    route added to any of the three tables is fuzzed the day it lands (the test hooks' route aside)."""
    own = dict.fromkeys(OWN_ROUTES, "GET")
    apis = {params.PATHS[route]: "POST" for route in params.ROUTES}
    page = {route.path: "GET" for route in ui.routes()} if with_ui else {}
    return own | apis | page


def create_app(worker: Worker, model_id: str, api_keys: Sequence[str] = (), *, bind: str = "127.0.0.1",
               allowed_hosts: Sequence[str] = (), cors_origins: Sequence[str] = (),
               body_timeout_s: float = limits.BODY_TIMEOUT_S, with_ui: bool = True) -> Starlette:
    """The routes behind the gate (gate.py: Host, Origin and Content-Type checked first); `with_ui`: the chat
    page at / (ui.py; public: its files hold no secret, the API calls it makes need the key)."""
    server = Server(worker, model_id, api_keys, body_timeout_s)

    def guarded(handler: Callable, public: bool = False) -> Callable:
        async def endpoint(request: HttpRequest) -> Response:
            path = request.url.path
            if not public and not server._authorized(request):
                return _error(ApiError(401, "a valid API key is needed: 'Authorization: Bearer KEY' or 'x-api-key: "
                                       "KEY'", type="authentication_error", code="invalid_api_key"), path)
            try:
                return await handler(request)
            except ApiError as exc:
                return _error(exc, path)
            except Exception as exc:  # a fault of ours: still the API's error object
                return _error(ApiError(500, f"the server failed on this request ({type(exc).__name__})",
                                       type="server_error"), path)
        return endpoint

    routes = [Route(path, guarded(getattr(server, name), public=public), methods=["GET"])
              for path, (name, public) in OWN_ROUTES.items()]
    handlers = {"chat": server.chat_completions, "completions": server.completions, "messages": server.messages,
                "count_tokens": server.count_tokens, "responses": server.responses}
    routes += [Route(params.PATHS[route], guarded(handlers[route]), methods=["POST"]) for route in params.ROUTES]
    routes += ui.routes() if with_ui else []
    if os.environ.get(TEST_HOOKS) == "1" and native.load().build_info().test_faults:
        routes.append(Route("/_test/kill-worker", guarded(server.kill_worker), methods=["POST"]))
    async def http_error(request: HttpRequest, exc: Exception) -> Response:
        """Starlette's own answers (no such route: 404, a wrong method: 405) as OpenAI's error object too."""
        assert isinstance(exc, HTTPException)
        messages = {404: f"there is no route {request.url.path[:200]!r} (see /v1/models)",
                    405: f"{request.method[:20]} is not a method of {request.url.path[:200]!r}"}
        message = messages.get(exc.status_code, str(exc.detail))
        response = _error(ApiError(exc.status_code, message), request.url.path)
        response.headers.update(exc.headers or {})
        return response

    gate = Middleware(Gate, bind=bind, allowed_hosts=allowed_hosts, cors_origins=cors_origins)
    app = Starlette(routes=routes, middleware=[gate], exception_handlers={HTTPException: http_error})
    app.router.redirect_slashes = False   # "/v1/completions/" is a 404, not a redirect built from the Host
    app.state.server = server
    return app
