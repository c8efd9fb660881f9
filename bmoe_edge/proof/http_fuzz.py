"""The HTTP fuzz campaign: generated requests against a real `bmoe-edge serve`, and after each one the
server must still be a server.

The server runs the tiny qwen3moe fixture (with Qwen3's own Jinja template from the pinned llama.cpp
source when it is there, so tools and forced calls are rendered and grammar-constrained). Requests
come from a seeded mutator (the same seed, the same requests): valid seed requests of every route
(params.PATHS: Chat Completions, Completions, Anthropic's Messages and count_tokens, the Responses API) and
feature (streaming, usage, stop strings, logprobs, echo, logit_bias, penalties, response_format, tools,
forced calls, earlier tool calls, reasoning switches), and a GET of every other path the server routes
(app.paths(): /health, /metrics, /v1/models, the chat page and each of its files), then one to three
mutations each: at the JSON level (a value replaced by a hostile one — lone surrogates, control-token
text, deep nesting, huge or negative numbers, wrong types —, a key dropped or added, the body wrapped),
at the byte level (cut, flipped, invalid UTF-8, garbage), or at the HTTP level (another routed path, a
path next to one — a slash, a dot segment or traversal, an encoded or doubled character, a query, a NUL,
8,000 characters more — or one no route has, another method or Content-Type, no or a wrong key, a web
Origin, a rebound Host, a declared length the body never reaches). The paths come from the server's own
tables, so a route added there is in the campaign with no change here.

After each request the campaign checks:
- it was answered within the timeout (`hang` otherwise);
- the status is 2xx or 4xx, and every 4xx (and 5xx) body is the route's API's error object (Anthropic's on
  its routes, OpenAI's elsewhere); a 2xx body is an answer (whole, or server-sent events ending as the API
  ends a stream: [DONE], message_stop, response.completed / incomplete / failed, or an error event);
- a valid greedy request right after gets the same answer as before the campaign (`probe`);
- /health says ok (`health`), and the process is alive (`dead`; it is restarted to go on).

Outcomes: `ok` (2xx), `refused` (a well-formed 4xx), `protocol` (bytes that are not HTTP, answered 400 by
uvicorn's parser before any route, or the connection closed on them) pass; `server-error` (5xx), `bad-body`, `hang`,
`probe`, `health`, `dead` are findings."""

from __future__ import annotations

import copy
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bmoe_edge.proof import conn_fuzz, request_space
from bmoe_edge.proof.http_checks import outcome_of
from bmoe_edge.serve import app, params

OUTCOMES = ("ok", "refused", "protocol", "server-error", "bad-body", "hang", "probe", "health", "dead")
PASSING = ("ok", "refused", "protocol")
KEY = "fuzz-key-3b9c"
PROBE = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
          "required": ["ok"], "additionalProperties": False}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"c\"}"}}

# (path, body): valid requests of every route and feature; max_tokens small, so a case is quick.
SEEDS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 3}),
    ("/v1/completions", {"prompt": ["The sea"], "max_tokens": 3, "temperature": 0.7, "seed": 3, "stop": ["\n", "e"]}),
    ("/v1/completions", {"prompt": "Go", "max_tokens": 4, "stream": True}),
    ("/v1/completions", {"prompt": "JSON:", "max_tokens": 6, "response_format": {"type": "json_object"}}),
    ("/v1/completions", {"prompt": "Once more", "max_tokens": 2, "logprobs": 3, "echo": True,
                         "logit_bias": {"11": -100, "12": 5}, "presence_penalty": 1.5, "repeat_last_n": 16}),
    ("/v1/completions", {"prompt": "Go on", "max_tokens": 3, "logprobs": 0, "stream": True,
                         "frequency_penalty": -0.5, "repeat_penalty": 1.3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": True,
                              "top_logprobs": 2, "stream": True, "logit_bias": {"0": 100}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": [{"type": "text", "text": "Name a colour"}]}],
                              "max_tokens": 3, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "temperature": 1.0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True,
                              "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "A fox"}], "max_tokens": 8,
                              "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "x", "schema": SCHEMA}}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 6,
                              "tools": [WEATHER], "tool_choice": "required"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 4,
                              "tools": [WEATHER], "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Weather in Oslo?"},
                                           {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                           {"role": "tool", "tool_call_id": "call_1", "content": "4 C"}],
                              "tools": [WEATHER], "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "think": False,
                              "chat_template_kwargs": {"enable_thinking": False}}),
    # Anthropic's Messages API
    ("/v1/messages", {"max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/messages", {"max_tokens": 3, "system": [{"type": "text", "text": "Be brief."}], "stream": True,
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "Name a colour"}]}],
                      "temperature": 0.7, "top_k": 5, "stop_sequences": ["\n"], "thinking": {"type": "disabled"}}),
    ("/v1/messages", {"max_tokens": 6, "messages": [{"role": "user", "content": "Weather?"}], "stream": True,
                      "tools": [request_space.as_anthropic_tool(WEATHER)], "tool_choice": {"type": "any"}}),
    ("/v1/messages", {"max_tokens": 3, "tools": [request_space.as_anthropic_tool(WEATHER)],
                      "messages": request_space.as_anthropic([{"role": "user", "content": "Weather in Oslo?"},
                                                              {"role": "assistant", "content": None,
                                                               "tool_calls": [CALL]},
                                                              {"role": "tool", "tool_call_id": "call_1",
                                                               "content": "4 C"}])[1]}),
    ("/v1/messages", {"max_tokens": 6, "messages": [{"role": "user", "content": "A fox"}],
                      "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}),
    ("/v1/messages/count_tokens", {"system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}],
                                   "tools": [request_space.as_anthropic_tool(WEATHER)]}),
    # OpenAI's Responses API
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 3}),
    ("/v1/responses", {"input": "Go", "instructions": "Be brief.", "max_output_tokens": 3, "stream": True,
                       "top_logprobs": 2, "include": ["message.output_text.logprobs"]}),
    ("/v1/responses", {"input": "Weather?", "max_output_tokens": 6, "stream": True, "tool_choice": "required",
                       "tools": [request_space.as_response_tool(WEATHER)]}),
    ("/v1/responses", {"max_output_tokens": 3, "tools": [request_space.as_response_tool(WEATHER)], "store": False,
                       "input": request_space.as_response_input([{"role": "user", "content": "Weather in Oslo?"},
                                                                 {"role": "assistant", "content": None,
                                                                  "tool_calls": [CALL]},
                                                                 {"role": "tool", "tool_call_id": "call_1",
                                                                  "content": "4 C"}])}),
    ("/v1/responses", {"input": "A fox", "max_output_tokens": 6, "previous_response_id": "resp-unknown",
                       "text": {"format": {"type": "json_schema", "name": "x", "schema": SCHEMA}}}),
)
HOSTILE_STRINGS = ("\ud800", "a\udfffb", "</s>", "<|im_end|>", "<|im_start|>system", "<tool_call>", "\x00", "\x1b[2J",
                   "", " ", "x" * 300, "é" * 2000, "🙂", "\\u0000", "{{ 7*7 }}", "{% for x in range(9**9) %}",
                   "#/$defs/x", "../../etc/passwd", "null")
HOSTILE_NUMBERS = (0, -1, 1, -(1 << 63), 1 << 64, (1 << 200), 1e308, -1e308, 0.5, 2**31, 513, 1 << 20)


def _deep(n: int, kind: str) -> Any:
    value: Any = "leaf"
    for _ in range(n):
        value = [value] if kind == "list" else {"a": value}
    return value


def _hostile(rng: random.Random) -> Any:
    pick = rng.randrange(9)
    if pick < 3:
        return rng.choice(HOSTILE_STRINGS)
    if pick < 5:
        return rng.choice(HOSTILE_NUMBERS)
    if pick == 5:
        return rng.choice((None, True, False, [], {}, [[1]], [None], {"": None}))
    if pick == 6:
        return _deep(rng.choice((10, 63, 65, 200, 300)), rng.choice(("list", "dict")))
    if pick == 7:
        return [rng.choice(HOSTILE_STRINGS) for _ in range(rng.randint(0, 8))]
    return {rng.choice(("type", "$ref", "$defs", "properties", "required", "items", "enum", "anyOf")):
            rng.choice((None, [], {}, [[1]], "string", {"x": 1}, "#/$defs/x"))}


def _paths(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in a JSON value (a path of keys and indexes)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _set(root: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = root
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    return root


def _mutate_json(body: Any, rng: random.Random) -> tuple[Any, str]:
    places = list(_paths(body))
    path = rng.choice(places)
    kind = rng.randrange(6)
    where = "/".join(map(str, path)) or "body"
    if kind <= 2:
        return _set(body, path, _hostile(rng)), f"value@{where}"
    if kind == 3 and path:
        parent = body
        for k in path[:-1]:
            parent = parent[k]
        del parent[path[-1]]
        return body, f"drop@{where}"
    objects = [p for p in places if isinstance(_get(body, p), dict)]
    if kind == 4 and objects:
        target = rng.choice(objects)
        key = rng.choice(("stream", "stream_options", "tools", "tool_choice", "stop", "n", "model", "logprobs",
                          "response_format", "reasoning_effort", "messages", "prompt", "name", "tool_call_id",
                          "max_completion_tokens", "seed", "think", "chat_template_kwargs", "parameters",
                          "logit_bias", "top_logprobs", "echo", "presence_penalty", "frequency_penalty",
                          "repeat_penalty", "repeat_last_n", "best_of", "suffix", "store", "audio",
                          "service_tier", "system", "stop_sequences", "thinking", "input", "instructions",
                          "previous_response_id", "max_output_tokens", "include", "text", "reasoning",
                          "background", "tool_use_id", "input_schema", "output_config", "call_id"))
        _get(body, target)[key] = _hostile(rng)
        return body, f"add:{key}@{'/'.join(map(str, target)) or 'body'}"
    return rng.choice(([body], {"body": body}, [body, body])), "wrap"


def _get(root: Any, path: tuple) -> Any:
    for k in path:
        root = root[k]
    return root


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    body: bytes | None
    headers: dict[str, str]
    hangup_after: int | None = None   # the client reads this many bytes of the answer, then hangs up


def _encode(body: Any) -> bytes:
    # surrogates survive: json.dumps escapes them as \udxxx (the server must refuse them)
    return json.dumps(body).encode()


GET_SHARE = 0.15   # of the cases: a GET of a routed path (app.paths()), its headers, method or path then mutated
# Paths no route has, each one a way past a router: another API's, the test hooks', encoded dots.
UNROUTED = ("/v1/embeddings", "/_test/kill-worker", "/%2e%2e/etc", "/v1/messages/batches", "/v1/responses/resp-1",
            "/ui/", "/ui/..%2fapp.py", "/ui/%2e%2e/%2e%2e/pyproject.toml")


def cases(count: int, seed: int) -> Iterator[Case]:
    """`count` generated requests (the same for the same seed)."""
    rng = random.Random(seed)
    # Every path the server routes (its own, the APIs', the chat page's files) and its method. The POST routes'
    # requests start from SEEDS; a GET route's is the path itself.
    routed = app.paths()
    routed_paths = tuple(routed)
    gets = tuple(path for path, method in routed.items() if method == "GET")
    for n in range(count):
        if rng.random() < GET_SHARE:
            path, seed_body, method = rng.choice(gets), None, "GET"
            path = _near(path, rng) if rng.random() < 0.3 else path   # a page's file next to where it is
        else:
            (path, seed_body), method = rng.choice(SEEDS), "POST"
        body: Any = copy.deepcopy(seed_body)
        steps: list[str] = []
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
        raw: bytes | None = None
        for _ in range(rng.choice((0, 1, 1, 1, 2, 3))):   # a sixth go unchanged: the valid path is fuzzed too
            layer = rng.random() if body is not None else 0.8 + 0.2 * rng.random()   # a GET: its HTTP only
            if layer < 0.15 and isinstance(body, dict):   # schemas, tools, tool calls (request_space.py)
                body, step = request_space.with_structure(route_of(path), body, rng)
            elif layer < 0.4 and isinstance(body, dict):   # the parameter table's own values (request_space.py)
                body, step = request_space.with_parameters(route_of(path), body, rng)
            elif layer < 0.65:
                body, step = _mutate_json(body, rng)
            elif layer < 0.8:
                raw = _encode(body) if raw is None else raw
                raw, step = _mutate_bytes(raw, rng)
            else:
                step = _mutate_http(headers, rng, routed_paths)
                if step.startswith("method:"):
                    method = step.split(":", 1)[1]
                elif step.startswith("path:"):
                    path = step.split(":", 1)[1]
            steps.append(step)
        data = raw if raw is not None else _encode(body) if body is not None else None
        if method in ("GET", "HEAD", "OPTIONS"):
            data = None
        hangup = rng.choice((0, 40, 400, 4000)) if rng.random() < 0.1 else None
        if hangup is not None:
            steps.append(f"hangup@{hangup}")
        yield Case(f"{n}:{path}:{'+'.join(steps) or 'valid'}", method, path, data, headers, hangup)


def route_of(path: str) -> params.Route:
    """The route whose parameters a body for `path` draws from (a path no route has: completions')."""
    return next((route for route, at in params.PATHS.items() if at == path), "completions")


def _mutate_bytes(raw: bytes, rng: random.Random) -> tuple[bytes, str]:
    kind = rng.randrange(6)
    at = rng.randrange(len(raw) + 1)
    if kind == 5:   # nesting past any recursion limit, which only raw text can carry
        n = rng.choice((1000, 20000, 200000))
        return raw[:at] + b"[" * n + b"]" * n + raw[at:], f"deep@{at}x{n}"
    if kind == 0:
        return raw[:at], f"cut@{at}"
    if kind == 1 and raw:
        i = rng.randrange(len(raw))
        return raw[:i] + bytes([raw[i] ^ (1 << rng.randrange(8))]) + raw[i + 1:], f"flip@{i}"
    if kind == 2:
        bad = rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x00"))
        return raw[:at] + bad + raw[at:], f"bytes@{at}"
    if kind == 3:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))), "garbage"
    return raw + raw, "twice"


def _mutate_http(headers: dict[str, str], rng: random.Random, routed: tuple[str, ...]) -> str:
    kind = rng.randrange(9)
    if kind == 0:
        headers["Content-Type"] = rng.choice(("text/plain", "application/x-www-form-urlencoded", "",
                                              "application/json; charset=latin-1", "APPLICATION/JSON"))
        return f"content-type:{headers['Content-Type']}"
    if kind == 1:
        headers.pop("Authorization", None)
        return "no-key"
    if kind == 2:
        headers["Authorization"] = rng.choice(("Bearer wrong", f"bearer {KEY}", f"Bearer {KEY} ", "Basic eDp5",
                                               "Bearer " + "k" * 5000))
        return "wrong-key"
    if kind == 3:
        headers["Origin"] = rng.choice(("https://evil.example", "null", "http://localhost"))
        return "origin"
    if kind == 4:
        headers["Host"] = rng.choice(("evil.example", "localhost.evil.example", "127.0.0.1.nip.io", "[::1]:1", ""))
        return f"host:{headers['Host']}"
    if kind == 5:
        return "method:" + rng.choice(("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"))
    if kind == 6:
        path = rng.choice(routed)
        return "path:" + rng.choice((path, _near(path, rng), rng.choice(UNROUTED)))
    if kind == 7:
        headers["Content-Length"] = str(rng.choice((0, 1, 1 << 30, 4 << 20)))
        return f"length:{headers['Content-Length']}"
    headers["Transfer-Encoding"] = "chunked"
    return "chunked-claim"


def _near(path: str, rng: random.Random) -> str:
    """A path next to a routed one: a slash, a dot segment or a traversal after it, a query, an encoded or doubled
    character, another case, a NUL, a path past any sane length."""
    at = rng.randrange(1, len(path) + 1)
    return rng.choice((path + "/", path + "/.", path + "/../app.py", path + "?x=%00&y=" + "z" * 64, "/" + path,
                       path[:at] + "%2F" + path[at:], path[:at] + "%" + path[at:], path.upper(), path + "%00",
                       path + ";x", path[:at] + "//" + path[at:], path + "/" + "a" * 8000))


@dataclass(frozen=True)
class HttpResult:
    case: str
    outcome: str
    status: int
    detail: str = ""

    def record(self) -> dict[str, Any]:
        return asdict(self)


class Server:
    """A `bmoe-edge serve` process on loopback, restarted when it dies."""

    def __init__(self, model: Path, template: Path | None, workdir: Path, parallel: int = 1) -> None:
        self.model, self.template, self.workdir, self.parallel = model, template, workdir, parallel
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.log: list[str] = []
        self.tracebacks = 0

    def start(self) -> None:
        args = [sys.executable, "-m", "bmoe_edge", "serve", "-m", str(self.model), "--port", "0", "-t", "1",
                "--ctx", "512", "--api-key", KEY, "--queue", "2", "--body-timeout", "2",
                "--parallel", str(self.parallel)]
        if self.template is not None:
            args += ["--chat-template", str(self.template)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, GGML_NO_BACKTRACE="1"))
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError(f"the server did not start: exit {self.proc.returncode}")
            found = re.search(r"serving \S+ on http://[\d.]+:(\d+)/v1", line)
            if found:
                self.port = int(found[1])
                threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
                return
        raise RuntimeError("the server did not start within 120 s")

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.log.append(line.rstrip("\n"))
            del self.log[:-50]
            self.tracebacks += line.startswith("Traceback")   # an expected error is one line, never a traceback

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
                timeout: float, hangup_after: int | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request; with `hangup_after` the answer is read that far and the connection closed."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            if body is not None and "Content-Length" not in headers and "Transfer-Encoding" not in headers:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            r = conn.getresponse()
            if hangup_after is not None:
                return r.status, {"x-hung-up": "1"}, r.read(hangup_after)
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()


@dataclass
class Vitals:
    """What the campaign watches besides each answer: /health polled all along (its worst answer time and the
    polls that were not a 200 within HEALTH_LIMIT_S), and the server's RSS and open descriptors after each
    request, for the flatness check (the first window against the last)."""

    health_worst_s: float = 0.0
    health_slow: int = 0
    health_polls: int = 0
    samples: list[tuple[int, int]] = field(default_factory=list)   # (rss KiB, open descriptors) per request
    restarts: int = 0
    tracebacks: int = 0   # in the server's log

    def growth(self, window: int = 500) -> tuple[float, float]:
        """RSS and descriptors of the last `window` requests over the first's (medians): 1.0 is flat."""
        if len(self.samples) < 2 * window:
            window = max(1, len(self.samples) // 2)
        first, last = self.samples[:window], self.samples[-window:]

        def ratio(i: int) -> float:
            a, b = statistics.median(x[i] for x in first), statistics.median(x[i] for x in last)
            return b / a if a else 1.0
        return (ratio(0), ratio(1)) if self.samples else (1.0, 1.0)

    def problems(self, tolerance: float = 0.10) -> list[str]:
        out = []
        if self.health_slow:
            out.append(f"/health was slower than {HEALTH_LIMIT_S:g} s (or not ok) {self.health_slow} times "
                       f"(worst {self.health_worst_s:.2f} s)")
        rss, fds = self.growth()
        if rss > 1 + tolerance:
            out.append(f"RSS grew {rss:.2f}x from the first requests to the last")
        if fds > 1 + tolerance:
            out.append(f"open descriptors grew {fds:.2f}x from the first requests to the last")
        if self.tracebacks:
            out.append(f"the server's log has {self.tracebacks} tracebacks")
        return out

    def summary(self) -> str:
        rss, fds = self.growth()
        return (f"/health: {self.health_polls} polls, worst {self.health_worst_s:.3f} s, {self.health_slow} over "
                f"{HEALTH_LIMIT_S:g} s; RSS last/first {rss:.3f}, descriptors last/first {fds:.3f}; "
                f"restarts {self.restarts}; tracebacks {self.tracebacks}")


HEALTH_LIMIT_S = 1.0
HEALTH_EVERY_S = 0.25


def _poll_health(server: Server, vitals: Vitals, done: threading.Event) -> None:
    while not done.wait(HEALTH_EVERY_S):
        if not server.alive():
            continue
        started = time.monotonic()
        try:
            status, _, _ = server.request("GET", "/health", None, {}, 5.0)
        except (OSError, http.client.HTTPException):
            status = 0
        took = time.monotonic() - started
        vitals.health_polls += 1
        vitals.health_worst_s = max(vitals.health_worst_s, took)
        if status != 200 or took > HEALTH_LIMIT_S:
            vitals.health_slow += 1


# Requests that take the server's one-time buffers to their size before anything is measured: every seed once,
# and a prompt scored in a whole batch (echo with logprobs: the context's logits buffer grows to a scoring
# chunk's, 16 MiB at most, and llama.cpp never shrinks it). The flatness check then sees growth per request.
WARM_UP = (*SEEDS, ("/v1/completions", {"prompt": "word " * 300, "max_tokens": 1, "echo": True, "logprobs": 5}))


def _warm_up(server: Server, auth: dict[str, str], timeout: float) -> None:
    for path, body in WARM_UP:
        server.request("POST", path, json.dumps(body).encode(), auth, timeout)


def run_campaign(model: Path, workdir: Path, count: int, seed: int = 0, timeout: float = 60.0,
                 template: Path | None = None, parallel: int = 1,
                 vitals: Vitals | None = None) -> Iterator[HttpResult]:
    """Every generated request, then the checks; yields one result per request. `vitals` (when given) is filled
    in along the way: /health polled throughout, RSS and descriptors after each request."""
    workdir.mkdir(parents=True, exist_ok=True)
    server = Server(model, template, workdir, parallel)
    server.start()
    auth = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    vitals = vitals if vitals is not None else Vitals()
    done = threading.Event()
    poller = threading.Thread(target=_poll_health, args=(server, vitals, done), daemon=True)

    def probe() -> str:
        status, _, data = server.request("POST", "/v1/completions", json.dumps(PROBE).encode(), auth, timeout)
        return json.loads(data)["choices"][0]["text"] if status == 200 else f"<{status}>"

    try:
        expected = probe()
        _warm_up(server, auth, timeout)
        poller.start()
        for case in cases(count, seed):
            yield _one(server, case, timeout, probe, expected)
            if not server.alive():
                vitals.restarts += 1
                server.start()
            elif server.proc is not None:
                vitals.samples.append((conn_fuzz.rss_kib(server.proc.pid), conn_fuzz.open_fds(server.proc.pid)))
    finally:
        done.set()
        server.stop()
        vitals.tracebacks = server.tracebacks


def _one(server: Server, case: Case, timeout: float, probe: Any, expected: str) -> HttpResult:
    try:
        status, headers, data = server.request(case.method, case.path, case.body, case.headers, timeout,
                                               case.hangup_after)
    except TimeoutError:
        return HttpResult(case.name, "hang", 0, f"no answer within {timeout:g} s")
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        if not server.alive():
            code = server.proc.returncode if server.proc else None
            return HttpResult(case.name, "dead", 0, f"the server exited {code}: " + " | ".join(server.log[-3:]))
        # the server may close a connection it will not read (a body it refused before reading it)
        status, headers, data = -1, {}, str(exc).encode()
    outcome, detail = outcome_of(case.method, case.path, status, headers, data)
    if outcome not in PASSING:
        return HttpResult(case.name, outcome, status, detail)
    if not server.alive():
        return HttpResult(case.name, "dead", status, " | ".join(server.log[-3:]))
    try:
        got = probe()
        if got != expected:
            return HttpResult(case.name, "probe", status, f"the greedy answer is {got!r}, was {expected!r}")
        h_status, _, h_data = server.request("GET", "/health", None, {}, timeout)
        if h_status != 200 or json.loads(h_data).get("status") != "ok":
            return HttpResult(case.name, "health", status, f"/health {h_status}: {h_data[:200]!r}")
    except TimeoutError:
        return HttpResult(case.name, "hang", status, "the probe after it got no answer")
    except (ConnectionError, http.client.HTTPException, OSError, ValueError, KeyError) as exc:
        return HttpResult(case.name, "dead" if not server.alive() else "probe", status, f"{type(exc).__name__}: {exc}")
    return HttpResult(case.name, outcome, status, detail)


def qwen3_template() -> Path | None:
    """Qwen3's own chat template from the pinned llama.cpp source (tools, forced calls), if extracted."""
    from bmoe_edge import llama_source

    path = llama_source.default_dest(True) / "models" / "templates" / "Qwen-Qwen3-0.6B.jinja"
    return path if path.is_file() else None


def table(results: list[HttpResult]) -> str:
    counts = Counter(r.outcome for r in results)
    statuses = Counter(r.status for r in results)
    lines = ["| requests | " + " | ".join(OUTCOMES) + " |", "|---" * (len(OUTCOMES) + 1) + "|",
             f"| {len(results)} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |", "",
             "statuses: " + ", ".join(f"{s or 'none'}: {n}" for s, n in sorted(statuses.items()))]
    return "\n".join(lines)
