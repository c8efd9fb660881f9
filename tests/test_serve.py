"""`bmoe-edge serve` as its users meet it: OpenAI's own client against a real server process on
loopback (chat, streaming, completions, usage), bad requests answered with OpenAI's error object while
the server keeps serving, the API key, a full queue (429), a client that hangs up, and a bounded load."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import client as http_client
from pathlib import Path

import openai
import pytest

from bmoe_edge.engine import chat
from bmoe_edge.engine.session import Engine, Sampling
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.synthetic import tinymoe

from conftest import assert_clean_error, run_cli

KEY = "test-key-7d1f"


@dataclass
class Response:
    status_code: int
    headers: dict[str, str]
    text: str

    def json(self) -> dict:
        return json.loads(self.text)


def http(url: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 120) -> Response:
    """One plain HTTP request (the standard library: the raw bytes the server sees)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http_client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode())
    finally:
        conn.close()


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    model_id: str
    stderr: str = ""

    def drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr += line

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key or "none", max_retries=0, timeout=60)

    def metrics(self) -> dict[str, float]:
        text = http(self.url, "GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        return {name: float(value) for name, value in re.findall(r"^(\w+) (\S+)$", text, re.M)}


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


def start(model: Path, *args: str, env: dict[str, str] | None = None) -> Server:
    process = subprocess.Popen(
        [sys.executable, "-m", "bmoe_edge", "serve", "-m", str(model), "--port", "0", "-t", "1", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 120
    assert process.stderr is not None
    seen = ""
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen += line
        if not line and process.poll() is not None:
            raise AssertionError(f"the server exited: {process.returncode}")
        found = re.search(r"serving (\S+) on (http://[\d.]+:\d+)/v1", line)
        if found:
            server = Server(found[2], process, found[1], seen)
            threading.Thread(target=server.drain, daemon=True).start()  # keep the pipe drained
            return server
    process.kill()
    raise AssertionError("the server did not start")


def stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[Server]:
    s = start(model, "--ctx", "512", "--api-key", KEY, "--queue", "2")
    yield s
    stop(s)


def long_stream(server: Server, timeout: float) -> tuple[http_client.HTTPConnection, http_client.HTTPResponse]:
    """A streamed completion of up to 400 tokens, its response open: read what it needs, then hang up."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http_client.HTTPConnection(host, int(port), timeout=timeout)
    body = json.dumps({"prompt": "Go", "max_tokens": 400, "temperature": 0, "stream": True})
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    return conn, conn.getresponse()


def post(server: Server, path: str, body: str | dict, key: str | None = KEY) -> Response:
    data = json.dumps(body) if isinstance(body, dict) else body
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    return http(server.url, "POST", path, data.encode(), headers)


def test_models_and_health(server: Server) -> None:
    assert [m.id for m in server.client(KEY).models.list()] == [server.model_id]
    health = http(server.url, "GET", "/health").json()
    assert health["status"] == "ok"


def test_chat_streamed_equals_chat_whole_and_greedy_equals_generate(server: Server, model: Path) -> None:
    client = server.client(KEY)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour"}]
    whole = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=12, temperature=0)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12 and whole.usage.total_tokens == whole.usage.prompt_tokens + 12
    stream = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # Greedy: the answer is `generate` on the prompt the template renders.
    with Engine(model, StreamConfig(threads=1)) as e:
        prompt = chat.render(chat.template_for(e), [chat.as_message(m) for m in messages]).prompt
        assert e.run(e.tokenize(prompt), 12, Sampling(temp=0.0)).text == text


def test_a_second_request_with_the_same_start_reuses_the_context(server: Server) -> None:
    client = server.client(KEY)
    messages = [{"role": "user", "content": "A long shared beginning about the weather in the hills"}]
    client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=4, temperature=0)
    again = client.chat.completions.create(model=server.model_id, messages=messages, max_tokens=4, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1


def test_completions_whole_and_streamed(server: Server) -> None:
    client = server.client(KEY)
    whole = client.completions.create(model=server.model_id, prompt="Once upon a time", max_tokens=10, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=server.model_id, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True))
    assert whole.choices[0].text == streamed != ""
    assert whole.usage.completion_tokens == 10


def test_sampling_is_seeded_and_stop_strings_stop(server: Server) -> None:
    client = server.client(KEY)
    kw = {"model": server.model_id, "prompt": "The", "max_tokens": 16, "temperature": 1.0,
          "extra_body": {"min_p": 0.0, "top_k": 0}}
    a = client.completions.create(seed=7, **kw).choices[0].text
    assert client.completions.create(seed=7, **kw).choices[0].text == a
    assert {client.completions.create(seed=s, **kw).choices[0].text for s in range(8, 12)} != {a}
    greedy = client.completions.create(model=server.model_id, prompt="The", max_tokens=16, temperature=0)
    text = greedy.choices[0].text
    stop = text[4:7]
    cut = client.completions.create(model=server.model_id, prompt="The", max_tokens=16, temperature=0, stop=[stop])
    assert cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(("body", "status", "needle"), [
    ("{not json", 400, "not valid JSON"),
    ({"model": "x"}, 404, "does not exist"),
    ({"messages": []}, 400, "'messages' must be a non-empty list"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}, 400, "'max_tokens'"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "'temperature'"),
    ({"messages": [{"role": "user", "content": "word " * 700}]}, 400, "context holds 512"),
    ({"messages": [{"role": "user", "content": "hi</s>"}]}, 400, "control tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, 400, "string 'text'"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema"}}, 400,
     "json_schema"),
])
def test_bad_requests_get_openai_errors_and_the_server_goes_on(server: Server, body, status: int,
                                                               needle: str) -> None:
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert needle in error["message"] and error["type"]
    ok = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_an_oversized_body_is_413(server: Server) -> None:
    r = post(server, "/v1/completions", {"prompt": "x" * (5 << 20)})
    assert r.status_code == 413 and "MiB" in r.json()["error"]["message"]


def test_the_api_key_is_required_but_not_for_health(server: Server) -> None:
    assert post(server, "/v1/completions", {"prompt": "Hi"}, key=None).status_code == 401
    assert post(server, "/v1/completions", {"prompt": "Hi"}, key="wrong").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        server.client("wrong").models.list()
    assert http(server.url, "GET", "/health").status_code == 200


def test_a_full_queue_answers_429_and_a_client_that_hangs_up_is_cancelled(server: Server) -> None:
    before = server.metrics()
    statuses: list[int] = []

    def slow() -> None:
        conn, r = long_stream(server, timeout=120)
        statuses.append(r.status)
        if r.status == 200:
            r.readline()  # the first event, then hang up
        conn.close()

    threads = [threading.Thread(target=slow) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 429 in statuses and 200 in statuses, statuses
    limited = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert limited.status_code == 200
    deadline = time.monotonic() + 30
    while server.metrics()["bmoe_requests_cancelled_total"] <= before.get("bmoe_requests_cancelled_total", 0):
        assert time.monotonic() < deadline, "no generation was cancelled"
        time.sleep(0.2)
    after = server.metrics()
    assert after["bmoe_requests_rejected_total"] > before["bmoe_requests_rejected_total"]
    # Hung-up requests stop early: far fewer than 400 tokens each were generated.
    generated = after["bmoe_completion_tokens_total"] - before["bmoe_completion_tokens_total"]
    assert generated < 400 * statuses.count(200)


def test_a_retry_after_header_comes_with_429(model: Path) -> None:
    s = start(model, "--queue", "1")
    try:
        responses: list[Response] = []

        def one() -> None:
            responses.append(post(s, "/v1/completions", {"prompt": "Go", "max_tokens": 200, "temperature": 0},
                                  key=None))
        threads = [threading.Thread(target=one) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        busy = [r for r in responses if r.status_code == 429]
        assert busy and all(r.headers["retry-after"].isdigit() for r in busy)
        assert busy[0].json()["error"]["code"] == "queue_full"
    finally:
        stop(s)


def test_a_bounded_load_keeps_memory_flat(server: Server) -> None:
    client = server.client(KEY)
    for i in range(200):
        r = client.completions.create(model=server.model_id, prompt=f"Request {i % 7}", max_tokens=3, temperature=0)
        assert r.choices[0].text is not None and r.usage.completion_tokens <= 3
        if i == 20:
            warm = server.metrics()["bmoe_resident_memory_bytes"]
    errors: list[BaseException] = []

    def client_loop(n: int) -> None:
        try:
            c = server.client(KEY)
            for _ in range(10):
                try:
                    r = c.chat.completions.create(model=server.model_id, max_tokens=3,
                                                  messages=[{"role": "user", "content": f"client {n}"}])
                    assert r.choices[0].message.role == "assistant"
                except openai.RateLimitError:
                    time.sleep(0.1)  # the queue holds 2; a 429 is a well-formed answer too
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    rss = server.metrics()["bmoe_resident_memory_bytes"]
    assert rss <= warm * 1.05 + (8 << 20), (warm, rss)


def test_a_port_in_use_is_one_line(model: Path, server: Server) -> None:
    port = server.url.rsplit(":", 1)[1]
    result = run_cli("serve", "-m", str(model), "--port", port, timeout=60)
    assert_clean_error(result, "cannot listen on 127.0.0.1:" + port)


def test_the_server_stops_cleanly_on_sigterm(model: Path) -> None:
    s = start(model)
    assert post(s, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, key=None).status_code == 200
    s.process.terminate()
    # uvicorn shuts down gracefully; serve then closes the engine and exits 0 (the signal is not raised again)
    assert s.process.wait(timeout=30) == 0
    time.sleep(0.2)   # the drain thread reads the rest
    # nothing of the engine's outlives it: the native fatal listener kept the worker and its chat templates,
    # and every stop wrote nanobind's "leaked ... a reference counting issue" lines into the service's log
    assert "leaked" not in s.stderr, s.stderr


def test_the_fatal_listener_reaches_the_worker_while_it_lives_and_keeps_nothing_alive() -> None:
    import gc
    import weakref

    from bmoe_edge.serve.server import _weak_listener

    class Worker:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def fatal(self, line: str) -> None:
            self.lines.append(line)

    worker = Worker()
    listener = _weak_listener(worker.fatal)
    listener("disk gone")
    assert worker.lines == ["disk gone"]
    gone = weakref.ref(worker)
    del worker
    gc.collect()
    assert gone() is None
    listener("after the server")   # the native side may still call it: nothing happens


# ---------------------------------------------------------------------------------------------------
# Nothing a request sends stops the server: it is refused before it is queued, or fails as its own error.

@pytest.mark.parametrize(("path", "raw", "needle"), [
    ("/v1/completions", '{"prompt":"\\ud800","max_tokens":4}', "lone surrogate"),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi \\udfff"}]}', "lone surrogate"),
    ("/v1/completions", '{"prompt":"hi","stop":["\\ud800"]}', "lone surrogate"),
    # found by the HTTP fuzz campaign (bench-data/2026-12-05/http-fuzz-apis): escaped in a tool call's JSON arguments,
    # it reached the template decoded, and its UnicodeEncodeError was a 500
    ("/v1/chat/completions", json.dumps({"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "f", "arguments": '{"q": "\\ud800"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4 C"}]}), "lone surrogate"),
    ("/v1/completions", '{"prompt":"hi","x":' + "[" * 5000 + "]" * 5000 + "}", "nests deeper"),
    ("/v1/completions", '{"prompt":"hi","x":' + "[" * 100 + "]" * 100 + "}", "nests deeper"),
    ("/v1/completions", b'{"prompt":"\xff\xfe"}', "not valid JSON"),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":"x"}',
     "stream_options"),
    ("/v1/completions", '{"prompt":"hi","stream_options":{"include_usage":true}}', "stream_options"),
    ("/v1/completions", '{"prompt":"hi","stream":"yes"}', "'stream'"),
    ("/v1/completions", json.dumps({"prompt": "hi", "stop": ["ab" * 200]}), "256 characters"),
    ("/v1/completions", json.dumps({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}), "up to 4"),
])
def test_a_request_that_cannot_be_served_is_a_400_before_it_is_queued(server: Server, path: str, raw: str | bytes,
                                                                      needle: str) -> None:
    data = raw if isinstance(raw, bytes) else raw.encode()
    r = http(server.url, "POST", path, data, {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]
    ok = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    assert http(server.url, "GET", "/health").json()["status"] == "ok"


def test_a_job_that_raises_anything_is_its_own_500_and_the_next_job_runs(model: Path) -> None:
    """Past the request checks (a Request built by hand), a lone surrogate's UnicodeEncodeError (the text's byte
    bound meets it first, else the binding's TypeError) is that job's 500; the engine thread lives on and answers
    the next job."""
    import queue as queue_module

    from bmoe_edge.serve.worker import Job, Request, Worker

    with Engine(model, StreamConfig(ctx=256, threads=1)) as e:
        worker = Worker(e)
        try:
            events: queue_module.Queue = queue_module.Queue()
            worker.submit(Job(Request(max_tokens=2, sampling=Sampling(temp=0.0), prompt="\ud800"), events.put))
            kind, (status, message) = events.get(timeout=30)
            assert (kind, status) == ("error", 500) and "EncodeError" in message   # the text's own bound: UTF-8
            worker.submit(Job(Request(max_tokens=2, sampling=Sampling(temp=0.0), prompt="Hi"), events.put))
            got = [events.get(timeout=60)]
            while got[-1][0] == "delta":
                got.append(events.get(timeout=60))
            assert got[-1][0] == "done" and got[-1][1].completion_tokens == 2
            assert worker.stats.failures == 1
        finally:
            worker.close()


def test_stop_strings_match_in_linear_time_and_as_a_plain_search_would() -> None:
    import random

    rng = random.Random(5)
    for _ in range(300):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 30)))
        s = chat.StopStrings(stops)
        out = ""
        i = 0
        while i < len(text) and not s.stopped:
            n = rng.randint(1, 4)
            out += s.feed(text[i:i + n])
            i += n
        if not s.stopped:
            out += s.flush()
        ends = [(text.find(x) + len(x), -len(x)) for x in stops if x in text]
        if ends:   # the earliest stop string to end, the longest of those ending there
            end, neg = min(ends)
            assert s.stopped and out == text[: end + neg], (stops, text, out)
        else:
            assert not s.stopped and out == text, (stops, text, out)
    # a 256-character stop string over a long answer: linear, so quick
    s = chat.StopStrings(["a" * 255 + "b"] * 4)
    started = time.perf_counter()
    for _ in range(20000):
        assert s.feed("a") == "" or not s.stopped
    assert time.perf_counter() - started < 2 and not s.stopped


def test_a_dead_engine_thread_is_a_503_on_health_and_the_server_exits_non_zero(model: Path) -> None:
    s = start(model, env={"BMOE_EDGE_SERVE_TEST_HOOKS": "1"})
    try:
        assert http(s.url, "GET", "/health").status_code == 200
        assert post(s, "/_test/kill-worker", {}, key=None).status_code == 200
        deadline = time.monotonic() + 1
        while (health := http(s.url, "GET", "/health", timeout=1)).status_code == 200:
            assert time.monotonic() < deadline, "still ok a second after the engine thread died"
            time.sleep(0.02)
        assert health.status_code == 503 and health.json()["reason"].startswith("the engine thread"), health
        refused = post(s, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, key=None)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
        assert s.process.wait(timeout=30) == 1
        time.sleep(0.2)
        assert "error: the server stopped: the engine thread failed" in s.stderr, s.stderr
    finally:
        stop(s)


def test_the_test_hook_exists_only_when_asked_for(server: Server) -> None:
    assert post(server, "/_test/kill-worker", {}).status_code == 404
    assert http(server.url, "GET", "/health").json()["status"] == "ok"


# ---------------------------------------------------------------------------------------------------
# Fail closed: no key by accident.

def test_an_empty_key_file_or_a_blank_key_is_one_line_not_a_server_without_a_key(model: Path,
                                                                                   tmp_path: Path) -> None:
    empty = tmp_path / "key"
    empty.write_text("\n  \n")
    assert_clean_error(run_cli("serve", "-m", str(model), "--port", "0", "--api-key-file", str(empty), timeout=60),
                       "holds no key")
    assert_clean_error(run_cli("serve", "-m", str(model), "--port", "0", "--api-key", "  ", timeout=60),
                       "API key", "empty")
    assert_clean_error(run_cli("serve", "-m", str(model), "--port", "0", env={**os.environ,
                                                                             "BMOE_EDGE_API_KEY": ""}, timeout=60),
                       "empty")


def test_beyond_loopback_a_key_is_needed_unless_no_auth_says_so(model: Path, tmp_path: Path) -> None:
    assert_clean_error(run_cli("serve", "-m", str(model), "--port", "0", "--bind", "0.0.0.0", timeout=60),
                       "--bind 0.0.0.0 without an API key", "--no-auth")
    assert_clean_error(run_cli("serve", "-m", str(model), "--port", "0", "--no-auth", "--api-key", "k", timeout=60),
                       "--no-auth")
    s = start(model, "--bind", "0.0.0.0", "--no-auth")
    try:
        assert post(s, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, key=None).status_code == 200
        assert "without an API key (--no-auth)" in s.stderr
    finally:
        stop(s)


def test_a_key_file_with_several_keys_takes_each(model: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alpha-1\n\nbeta-2\n")
    keys.chmod(0o600)
    s = start(model, "--api-key-file", str(keys))
    try:
        for key in ("alpha-1", "beta-2"):
            assert post(s, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, key=key).status_code == 200
        for key in ("alpha-1 beta-2", "alpha", "", None):
            assert post(s, "/v1/completions", {"prompt": "Hi", "max_tokens": 1}, key=key).status_code == 401
    finally:
        stop(s)


# ---------------------------------------------------------------------------------------------------
# Browsers stay out by default: Host, Origin, Content-Type.

def _raw(server: Server, method: str, path: str, body: bytes | None = None, **headers: str) -> Response:
    return http(server.url, method, path, body, {k.replace("_", "-"): v for k, v in headers.items()})


def test_a_rebound_host_a_web_origin_and_a_non_json_body_are_refused(server: Server) -> None:
    port = server.url.rsplit(":", 1)[1]
    auth = f"Bearer {KEY}"
    body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
    rebound = _raw(server, "GET", "/v1/models", Host=f"evil.example:{port}", Authorization=auth)
    assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "host_not_allowed"
    assert _raw(server, "GET", "/health", Host="attacker.test").status_code == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"LOCALHOST.:{port}"):
        assert _raw(server, "GET", "/v1/models", Host=host, Authorization=auth).status_code == 200, host
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = _raw(server, "POST", "/v1/completions", body, Content_Type=content_type, Authorization=auth)
        assert r.status_code == 415 and "application/json" in r.json()["error"]["message"], content_type
    assert _raw(server, "POST", "/v1/completions", body, Authorization=auth).status_code == 415
    charset = _raw(server, "POST", "/v1/completions", body, Content_Type="application/json; charset=utf-8",
                   Authorization=auth)
    assert charset.status_code == 200
    for origin in ("https://evil.example", "null", f"http://localhost:{port}"):
        r = _raw(server, "POST", "/v1/completions", body, Content_Type="application/json", Authorization=auth,
                 Origin=origin)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", origin
        assert "access-control-allow-origin" not in r.headers
    preflight = _raw(server, "OPTIONS", "/v1/completions", Origin="https://evil.example",
                     Access_Control_Request_Method="POST")
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers


def test_cors_origin_and_allowed_host_let_one_page_in(model: Path) -> None:
    s = start(model, "--cors-origin", "https://app.example", "--allowed-host", "board.lan")
    try:
        app_origin = "https://app.example"
        preflight = _raw(s, "OPTIONS", "/v1/chat/completions", Origin=app_origin,
                         Access_Control_Request_Method="POST",
                         Access_Control_Request_Headers="content-type, authorization")
        assert preflight.status_code == 204, preflight.text
        assert preflight.headers["access-control-allow-origin"] == app_origin
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert {"content-type", "authorization"} <= {h.strip() for h in
                                                     preflight.headers["access-control-allow-headers"].split(",")}
        body = json.dumps({"prompt": "Hi", "max_tokens": 1}).encode()
        r = _raw(s, "POST", "/v1/completions", body, Content_Type="application/json", Origin=app_origin,
                 Host="board.lan:8080")
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app_origin
        assert r.headers["vary"] == "Origin"
        bad = _raw(s, "POST", "/v1/completions", body, Content_Type="application/json", Origin="https://other.example")
        assert bad.status_code == 403
        assert _raw(s, "GET", "/health", Host="other.lan").status_code == 403
        # OpenAI's client sends no Origin: unchanged
        assert s.client().completions.create(model=s.model_id, prompt="Hi", max_tokens=1).usage.completion_tokens == 1
    finally:
        stop(s)


def test_a_server_bound_to_all_addresses_answers_to_ip_addresses_not_to_names(model: Path) -> None:
    s = start(model, "--bind", "0.0.0.0", "--api-key", KEY)
    try:
        port = s.url.rsplit(":", 1)[1]
        auth = f"Bearer {KEY}"
        assert _raw(s, "GET", "/v1/models", Host=f"192.168.1.20:{port}", Authorization=auth).status_code == 200
        assert _raw(s, "GET", "/v1/models", Host=f"rebound.example:{port}", Authorization=auth).status_code == 403
    finally:
        stop(s)


# ---------------------------------------------------------------------------------------------------
# Clean shutdown: nothing waits forever, nothing is freed under a decode.

def _drain(events, timeout: float = 60) -> list[tuple[str, object]]:
    got = [events.get(timeout=timeout)]
    while got[-1][0] == "delta":
        got.append(events.get(timeout=timeout))
    return got


def test_closing_a_worker_with_a_full_queue_answers_every_job_and_does_not_block(model: Path) -> None:
    import queue as queue_module

    from bmoe_edge.serve.worker import Job, QueueFull, Request, Unavailable, Worker

    with Engine(model, StreamConfig(ctx=4096, threads=1)) as e:
        worker = Worker(e, queue_size=2)
        running: queue_module.Queue = queue_module.Queue()
        long = Request(max_tokens=4000, sampling=Sampling(temp=0.0), prompt="Go")
        worker.submit(Job(long, running.put))
        assert running.get(timeout=60)[0] == "delta"   # it runs
        waiting = [queue_module.Queue() for _ in range(2)]
        for q in waiting:
            worker.submit(Job(long, q.put))
        with pytest.raises(QueueFull):
            worker.submit(Job(long, lambda event: None))
        started = time.monotonic()
        assert worker.close(timeout=30)
        assert time.monotonic() - started < 5
        for q in waiting:
            assert q.get(timeout=1) == ("error", (503, "the server cannot answer: shutting down"))
        last = _drain(running)[-1]
        assert last[0] == "error" and last[1][0] == 503
        assert worker.unavailable() == "shutting down"
        with pytest.raises(Unavailable):
            worker.submit(Job(long, lambda event: None))


CLOSE_UNDER_NEXT = """
import sys, threading, time
from bmoe_edge.engine.session import Engine, Sampling
from bmoe_edge.engine.settings import StreamConfig
from bmoe_edge.errors import BmoeError
e = Engine(sys.argv[1], StreamConfig(ctx=4096, threads=1))
out = []
def gen():
    try:
        for t in e.generate("Go", 4000, Sampling(temp=0.0)):
            out.append(t)
    except BmoeError as exc:
        out.append(str(exc))
t = threading.Thread(target=gen)
t.start()
while len(out) < 3:
    time.sleep(0.001)
e.close()
t.join()
assert out[-1] == "the engine is closed", out[-1]
print("closed after", len(out) - 1, "tokens")
"""


def test_closing_an_engine_while_another_thread_decodes_waits_for_the_decode(model: Path) -> None:
    for _ in range(3):
        result = subprocess.run([sys.executable, "-c", CLOSE_UNDER_NEXT, str(model)], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "closed after" in result.stdout


def test_sigterm_during_a_stream_ends_it_and_answers_the_queued_requests(model: Path) -> None:
    s = start(model, "--ctx", "4096", "--queue", "4")
    try:
        host, port = s.url.removeprefix("http://").rsplit(":", 1)
        conn = http_client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Go", "max_tokens": 4000, "stream": True}),
                     headers={"Content-Type": "application/json"})
        stream = conn.getresponse()
        assert stream.status == 200 and stream.readline().startswith(b"data: ")
        queued: list[Response] = []
        waiter = threading.Thread(target=lambda: queued.append(post(s, "/v1/completions", {"prompt": "Hi",
                                                                                         "max_tokens": 2}, key=None)))
        waiter.start()
        time.sleep(0.5)
        started = time.monotonic()
        s.process.terminate()
        rest = stream.read().decode()   # ends: the job was cancelled
        assert "shutting down" in rest or rest.endswith("data: [DONE]\n\n") or rest == "", rest[-300:]
        waiter.join(timeout=30)
        assert queued and queued[0].status_code == 503, queued
        assert s.process.wait(timeout=30) == 0   # by its own path (the SIGTERM uvicorn caught is not raised again)
        assert time.monotonic() - started < 5
    finally:
        stop(s)


# ---------------------------------------------------------------------------------------------------
# Limits: connections, a body's time to arrive, what one tenant learns of another.

def test_a_trickled_body_is_408_and_idle_connections_past_the_limit_give_way(model: Path) -> None:
    import socket

    s = start(model, "--max-connections", "3", "--body-timeout", "1")
    host, port = s.url.removeprefix("http://").rsplit(":", 1)
    try:
        slow = socket.create_connection((host, int(port)))
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\"")
        started = time.monotonic()
        slow.settimeout(10)
        answer = ""
        while "body_timeout" not in answer and (part := slow.recv(65536).decode()):
            answer += part
        assert answer.startswith("HTTP/1.1 408") and "body_timeout" in answer, answer
        assert time.monotonic() - started < 5
        slow.close()
        idle = [socket.create_connection((host, int(port))) for _ in range(3)]
        time.sleep(0.3)
        try:   # the idle connection that waited longest is closed for it (tests/test_serve_connections.py)
            assert http(s.url, "GET", "/health").status_code == 200
        finally:
            for c in idle:
                c.close()
        time.sleep(0.3)
        assert http(s.url, "GET", "/health").status_code == 200
    finally:
        stop(s)


def test_cached_tokens_are_never_reported_across_api_keys(model: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("tenant-a\ntenant-b\n")
    s = start(model, "--api-key-file", str(keys))
    try:
        a, b = s.client("tenant-a"), s.client("tenant-b")
        messages = [{"role": "user", "content": "A secret plan about the hills and the weather"}]
        kw = {"model": s.model_id, "messages": messages, "max_tokens": 2, "temperature": 0}
        first = a.chat.completions.create(**kw)
        assert b.chat.completions.create(**kw).usage.prompt_tokens_details.cached_tokens == 0
        again = b.chat.completions.create(**kw)
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
        back = a.chat.completions.create(**kw)
        assert back.usage.prompt_tokens_details.cached_tokens == 0
        assert back.choices[0].message.content == first.choices[0].message.content   # the same greedy answer
    finally:
        stop(s)


def test_unknown_routes_and_methods_are_openai_errors_not_redirects(server: Server) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    for method, path, status in (("GET", "/v1/embeddings", 404), ("POST", "/v1/completions/", 404),
                                 ("GET", "/v1/completions", 405), ("DELETE", "/v1/models", 405)):
        r = http(server.url, method, path, b"{}" if method == "POST" else None,
                 auth | ({"Content-Type": "application/json"} if method == "POST" else {}))
        assert r.status_code == status and r.json()["error"]["message"], (method, path, r.status_code, r.text)


def test_an_engine_that_fails_every_request_is_unhealthy_and_the_server_restarts(model: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "secret-dir" / "model.gguf"   # a path the clients must not learn (issue 44, item 7)
    copy.parent.mkdir()
    shutil.copy(model, copy)
    s = start(copy)
    try:
        assert post(s, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, key=None).status_code == 200
        os.utime(copy, (time.time() + 100, time.time() + 100))   # the model file changed under the server
        for _ in range(3):
            r = post(s, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}, key=None)
            assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
            assert "secret-dir" not in r.text
        health = http(s.url, "GET", "/health")
        assert health.status_code == 503 and "failed on 3 requests in a row" in health.json()["reason"]
        assert "secret-dir" not in health.text
        assert s.process.wait(timeout=30) == 1
        time.sleep(0.2)
        assert "error: the server stopped: the engine failed on 3 requests in a row" in s.stderr, s.stderr
        assert "secret-dir" in s.stderr   # the operator's log says which file
    finally:
        stop(s)


def test_a_grammar_the_engine_refuses_is_the_requests_400(model: Path) -> None:
    import queue as queue_module

    from bmoe_edge.serve.worker import Job, Request, Worker

    with Engine(model, StreamConfig(ctx=256, threads=1)) as e:
        worker = Worker(e)
        try:
            events: queue_module.Queue = queue_module.Queue()
            bad = Request(max_tokens=2, sampling=Sampling(temp=0.0, grammar="root ::= nothing-here"), prompt="Hi")
            for _ in range(4):
                worker.submit(Job(bad, events.put))
                kind, (status, message) = events.get(timeout=30)
                assert (kind, status) == ("error", 400) and "grammar" in message
            assert worker.unavailable() is None and worker.engine_failures == 0
        finally:
            worker.close()
