"""No socket can hold `bmoe-edge serve` (bmoe_edge/serve/connections.py): idle and half-sent connections,
from one address or many, block neither /health nor a completion; a request head that does not arrive
in time is cut; /health answers while every request slot is taken; and a sample of the connection
campaign (bmoe_edge/proof/conn_fuzz.py). Real servers on loopback, the tiny qwen3moe fixture."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bmoe_edge.proof import conn_fuzz
from bmoe_edge.serve import connections
from bmoe_edge.serve.server import MAX_CONNECTIONS
from bmoe_edge.synthetic import tinymoe

from conftest import assert_clean_error, run_cli
from test_serve import Server, http, start, stop

HEAD_TIMEOUT_S = 1.0   # the servers here cut a head after 1 s (the default is connections.HEAD_TIMEOUT_S)
FAST = {connections.HEAD_TIMEOUT_ENV: str(HEAD_TIMEOUT_S)}
COMPLETION = json.dumps({"prompt": "Hi", "max_tokens": 2, "temperature": 0}).encode()
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def model() -> Path:
    return tinymoe.fixture("qwen3moe", "Q8_0")


@pytest.fixture(scope="module")
def server(model: Path) -> Iterator[Server]:
    s = start(model, env=FAST)
    # a first answer opens what the server keeps for its life (the prompt cache's files, its writer's): the tests
    # count descriptors against a server that has answered once, whichever of them runs first
    assert_served_quickly(s)
    yield s
    stop(s)


def address(s: Server) -> tuple[str, int]:
    host, port = s.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def half_sent(s: Server, source: str = "127.0.0.1", data: bytes = b"GET /heal") -> socket.socket:
    sock = socket.create_connection(address(s), timeout=5, source_address=(source, 0))
    if data:
        sock.sendall(data)
    return sock


def open_fds(s: Server) -> int:
    return len(os.listdir(f"/proc/{s.process.pid}/fd"))


def assert_served_quickly(s: Server) -> None:
    started = time.monotonic()
    health = http(s.url, "GET", "/health", timeout=1)
    assert health.status_code == 200, health.text
    assert time.monotonic() - started < 1
    done = http(s.url, "POST", "/v1/completions", COMPLETION, JSON, timeout=30)
    assert done.status_code == 200 and done.json()["choices"], done.text


def closed_by_server(sock: socket.socket, within_s: float) -> tuple[bool, bytes]:
    """Whether the server closed `sock` within `within_s` (and what it said first)."""
    sock.settimeout(within_s)
    said = b""
    try:
        while part := sock.recv(65536):
            said += part
    except TimeoutError:
        return False, said
    except ConnectionResetError:
        pass
    return True, said


def test_63_half_sent_sockets_block_neither_health_nor_a_completion(server: Server) -> None:
    held = [half_sent(server) for _ in range(MAX_CONNECTIONS - 1)]
    try:
        time.sleep(0.2)
        assert_served_quickly(server)
    finally:
        for sock in held:
            sock.close()


def test_200_sockets_from_several_addresses_are_capped_and_block_nothing(server: Server) -> None:
    before = open_fds(server)
    held = [half_sent(server, f"127.0.0.{2 + i % 8}", b"" if i % 3 else b"POST /v1/compl") for i in range(200)]
    try:
        time.sleep(0.3)
        limits = connections.Limits.for_max_connections(MAX_CONNECTIONS)
        assert open_fds(server) <= before + limits.connections
        assert_served_quickly(server)
        # the evicted ones were closed by the server: what a client holds open is at most the cap
        alive = sum(not closed_by_server(sock, 0.01)[0] for sock in held)
        assert alive <= limits.connections
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while open_fds(server) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_fds(server) <= before


def test_a_trickled_head_is_cut_at_the_timeout_first_and_on_keep_alive(server: Server) -> None:
    def trickle(sock: socket.socket, started: float) -> float:
        """One byte every 50 ms of a head that never ends; how long until the server cut it."""
        header = b"X-Slow: " + b"a" * 4000
        for i in range(200):
            try:
                sock.send(header[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            cut, said = closed_by_server(sock, 0.05)
            if cut:
                assert said.startswith(b"HTTP/1.1 408") and b"header_timeout" in said, said
                break
        return time.monotonic() - started

    first = half_sent(server, data=b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    try:
        elapsed = trickle(first, time.monotonic())
    finally:
        first.close()
    assert HEAD_TIMEOUT_S - 0.1 < elapsed < HEAD_TIMEOUT_S + 1, elapsed

    again = half_sent(server, data=b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    try:
        answer = again.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        answered = time.monotonic()
        again.sendall(b"GET /health HTTP/1.1\r\n")
        elapsed = trickle(again, answered)
    finally:
        again.close()
    assert elapsed < HEAD_TIMEOUT_S + 1, elapsed


def test_health_answers_while_every_request_slot_is_taken(model: Path) -> None:
    s = start(model, "--max-connections", "4", "--body-timeout", "20", env=FAST)
    slots = connections.Limits.for_max_connections(4).requests
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"prompt\"")
    try:
        held = [half_sent(s, data=head) for _ in range(slots)]   # bodies that never finish: the slots stay taken
        time.sleep(0.3)
        one_more = half_sent(s, data=head)
        one_more.settimeout(2)
        refused = b""
        while b"too_many_requests" not in refused and (part := one_more.recv(65536)):
            refused += part
        assert refused.startswith(b"HTTP/1.1 503") and b"too_many_requests" in refused, refused
        started = time.monotonic()
        health = http(s.url, "GET", "/health", timeout=1)
        assert health.status_code == 200 and time.monotonic() - started < 1, health.text
        for sock in [*held, one_more]:
            sock.close()
        time.sleep(0.3)
        assert_served_quickly(s)
    finally:
        stop(s)


def test_too_few_connections_or_a_bad_head_timeout_is_one_line_before_the_model_loads(model: Path) -> None:
    serve = ("serve", "-m", str(model), "--port", "0")
    assert_clean_error(run_cli(*serve, "--max-connections", "2", timeout=20), "--max-connections", "at least 3")
    bad = run_cli(*serve, env={**os.environ, connections.HEAD_TIMEOUT_ENV: "soon"}, timeout=20)
    assert_clean_error(bad, connections.HEAD_TIMEOUT_ENV)


def test_the_uvicorn_internals_the_limits_rely_on_are_there() -> None:
    """A uvicorn upgrade that renames or drops one fails here (and `serve` refuses to start, in one line)."""
    connections.check_uvicorn()


def test_a_sample_of_the_connection_campaign(server: Server) -> None:
    result = conn_fuzz.run_connection_campaign(server.url, server.process.pid, rounds=4, seed=1,
                                               head_timeout_s=HEAD_TIMEOUT_S)
    assert result.ok, result.findings
    assert result.rounds == 4 and result.health_worst_s < 1
    assert set(result.sockets) == set(conn_fuzz.ATTACKS)


def test_bytes_that_are_not_http_write_a_bounded_number_of_lines_to_the_log(server: Server) -> None:
    """uvicorn warns once per connection whose bytes are not HTTP: 300 of them wrote 300 journal lines (a flood at
    the client's connection rate). Now at most a burst a minute (connections.FewerRepeats)."""
    before = server.stderr.count("Invalid HTTP request")
    for _ in range(300):
        with socket.create_connection(address(server), timeout=5) as sock:
            sock.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
            sock.recv(1024)
    time.sleep(0.3)
    logged = server.stderr.count("Invalid HTTP request") - before
    assert 0 < logged <= connections.FewerRepeats().burst, logged
    assert_served_quickly(server)


def test_a_body_that_is_not_what_its_head_claims_ends_the_connection_without_a_traceback(model: Path) -> None:
    """Found by the HTTP fuzz: no key (the app answers 401) and a false chunked claim (h11 refuses the body, uvicorn
    answers 400 itself): the app's answer then failed in h11 and uvicorn logged a traceback for it."""
    s = start(model, "--api-key", "k-3f1c", env=FAST)
    try:
        body = b'{"messages": [{"role": "user", "content": "Hi"}]}\r\n\r\n'
        for _ in range(3):
            with socket.create_connection(address(s), timeout=5) as sock:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
                answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 4"), answer[:80]
        time.sleep(0.3)
        assert "Traceback" not in s.stderr, s.stderr[-3000:]
        assert http(s.url, "GET", "/health", timeout=2).status_code == 200
    finally:
        stop(s)
