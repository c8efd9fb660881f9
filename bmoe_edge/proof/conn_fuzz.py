"""The connection-level campaign: sockets that try to hold a running `bmoe-edge serve` rather than send it a bad
request. `fuzz --http` runs it beside the request campaign (bmoe_edge/proof/http_fuzz.py).

Each round opens sockets of a few seeded kinds (ATTACKS), from several loopback addresses (127.0.0.x, so
the per-address cap is met from more than one client), drives them for a little longer than the server's
request-head timeout, then closes what is left. Throughout:
- /health answers 200 within HEALTH_DEADLINE_S, from a connection of its own (`health`);
- the process is alive (`dead`);
- a head that never completes is cut by the server within its timeout and a second (`head-timeout`);
- the server holds at most its connection cap plus a few descriptors however many sockets arrive (`cap`);
- after each round every socket is reclaimed: its descriptors come back to the count before the campaign
  (`leak`), and open descriptors and RSS stay flat: the first and the last round's samples within 10% (`growth`);
- a completion is answered at the end (`completion`).
Only loopback targets; every loop bounded in rounds and time."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import random
import select
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bmoe_edge.net import is_loopback
from bmoe_edge.serve.connections import HEAD_TIMEOUT_S, Limits
from bmoe_edge.serve.server import MAX_CONNECTIONS

HEALTH_DEADLINE_S = 1.0
FLAT = 0.10            # first vs last round's descriptors and RSS
FD_SLACK = 4           # descriptors the server may open of its own beyond the sockets (a log, a cache file)
TICK_S = 0.1
RECLAIM_S = 5.0        # after a round, how long the server has to close what the client closed
SOURCES = 8            # client addresses 127.0.0.1 .. 127.0.0.SOURCES (/health is asked from the first)
ROUND_PAST_TIMEOUT_S = 1.5   # a round drives its sockets this much longer than the head timeout


@dataclass
class Held:
    sock: socket.socket
    kind: str
    opened: float
    trickle: bytes        # sent a byte a tick (b"": nothing more)
    sent: int = 0
    cut_at: float | None = None   # when the server closed it


def _head(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}".encode()


def _post_head(key: str | None, length: int) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n").encode()


STREAM_BODY = json.dumps({"prompt": "Once upon a time", "max_tokens": 64, "stream": True}).encode()
SLOW_BODY = json.dumps({"prompt": "Hi " * 20, "max_tokens": 1}).encode()

# kind -> (what is sent at once, what is then trickled a byte a tick), for a key (or None)
ATTACKS: dict[str, Callable[[str | None], tuple[bytes, bytes]]] = {
    "silent": lambda key: (b"", b""),                                   # connects, never sends
    "half-line": lambda key: (b"GET /v1/mod", b""),                     # half a request line, then nothing
    "byte-trickle": lambda key: (b"G", b"ET /" + b"a" * 8000 + b" HTTP/1.1\r\n\r\n"),   # a line a byte a tick
    "endless-headers": lambda key: (_head("/health"), b"X-Pad: " + b"y" * 4000),   # the blank line never comes
    "slow-body": lambda key: (_post_head(key, len(SLOW_BODY)), SLOW_BODY),           # a body a byte a tick
    "mid-response": lambda key: (_post_head(key, len(STREAM_BODY)) + STREAM_BODY, b""),  # hangs up on the answer
    "flood": lambda key: (b"GET /hea", b""),   # twice the server's cap: half from one address, half from all
}
CUT_BY_HEAD_TIMEOUT = ("silent", "half-line", "byte-trickle", "endless-headers", "flood")


@dataclass
class ConnectionCampaign:
    seed: int
    rounds: int = 0
    sockets: dict[str, int] = field(default_factory=dict)   # opened, by kind (a plain dict: asdict miscopies a Counter)
    refused: int = 0            # connects the kernel or the server refused at once (not findings)
    health_probes: int = 0
    health_worst_s: float = 0.0
    fds: list[int] = field(default_factory=list)    # the server's open descriptors after each round
    rss_kib: list[int] = field(default_factory=list)
    peak_fds: int = 0
    findings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def record(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


def run_connection_campaign(base_url: str, pid: int, *, rounds: int = 20, seconds: float = 600.0, seed: int = 0,
                            api_key: str | None = None, max_connections: int = MAX_CONNECTIONS,
                            head_timeout_s: float = HEAD_TIMEOUT_S) -> ConnectionCampaign:
    """Run the campaign against the server at `base_url` (loopback only) whose process is `pid` (its
    descriptors and RSS are read from /proc): `rounds` rounds, stopping early after `seconds`. The server's
    --max-connections and request-head timeout are `max_connections` and `head_timeout_s`; `api_key` if it
    has one. The same seed opens the same sockets in the same order."""
    host, port = _address(base_url)
    result = ConnectionCampaign(seed)
    rng = random.Random(seed)
    limits = dataclasses.replace(Limits.for_max_connections(max_connections), head_timeout_s=head_timeout_s)
    started = time.monotonic()
    if not _completion(host, port, api_key):
        result.findings.append("completion: a completion failed before the campaign")
        return result
    baseline = _reclaimed(pid, None)
    for number in range(rounds):
        if time.monotonic() - started > seconds:
            break
        _round(result, rng, (host, port), pid, api_key, limits, number, baseline)
        result.rounds += 1
        if not _alive(pid):
            result.findings.append(f"dead: the server exited in round {number}")
            return result
        settled = _reclaimed(pid, baseline)
        if settled > baseline + FD_SLACK:
            result.findings.append(f"leak: round {number} left {settled - baseline} descriptors open "
                                   f"({RECLAIM_S:g} s after its sockets closed)")
        result.fds.append(settled)
        result.rss_kib.append(rss_kib(pid))
    _check_flat(result)
    if not _completion(host, port, api_key):
        result.findings.append("completion: a completion failed after the campaign")
    return result


def _round(result: ConnectionCampaign, rng: random.Random, server: tuple[str, int], pid: int, key: str | None,
           limits: Limits, number: int, baseline: int) -> None:
    """One round: sockets of two to four kinds (two in turn, so four rounds meet every kind; one or two drawn),
    driven a tick at a time for a little longer than the head timeout, /health asked every few ticks, then
    all closed."""
    kinds = list(ATTACKS)
    in_turn = [kinds[(2 * number + i) % len(kinds)] for i in range(2)]
    chosen = dict.fromkeys([*in_turn, *rng.sample(kinds, rng.randint(1, 2))])
    held: list[Held] = []
    try:
        for kind in chosen:
            for source in _sources(kind, limits, rng):
                opened = _open(server, source, kind, key, rng)
                result.sockets[kind] = result.sockets.get(kind, 0) + 1
                if opened is None:
                    result.refused += 1
                else:
                    held.append(opened)
        for tick in range(int((limits.head_timeout_s + ROUND_PAST_TIMEOUT_S) / TICK_S)):
            _drive(held, rng)
            if tick % 3 == 0:
                _health(result, server, number)
            result.peak_fds = max(result.peak_fds, open_fds(pid))
            time.sleep(TICK_S)
        if result.peak_fds > baseline + limits.connections + FD_SLACK:
            result.findings.append(f"cap: the server held {result.peak_fds} descriptors by round {number}, past "
                                   f"its {limits.connections} connections")
        _check_cut(result, held, limits, number)
    finally:
        for h in held:
            h.sock.close()


def _sources(kind: str, limits: Limits, rng: random.Random) -> list[str]:
    """Where a kind's sockets come from: the flood twice the server's cap, its first half from one address
    (past the per-address cap), the rest from every source in turn; the others a few from anywhere."""
    if kind == "flood":
        return [f"127.0.0.{1 + (0 if i < limits.connections else i % SOURCES)}" for i in range(2 * limits.connections)]
    return [f"127.0.0.{1 + rng.randrange(SOURCES)}" for _ in range(rng.randint(1, 8))]


def _open(server: tuple[str, int], source: str, kind: str, key: str | None, rng: random.Random) -> Held | None:
    first, trickle = ATTACKS[kind](key)
    try:
        sock = socket.create_connection(server, timeout=2, source_address=(source, 0))
    except OSError:
        return None
    sock.setblocking(False)
    if rng.random() < 0.5:   # an abortive close (RST) for half of them: the server meets both kinds of end
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    if first:
        with contextlib.suppress(OSError):
            sock.sendall(first)
    return Held(sock, kind, time.monotonic(), trickle)


def _drive(held: list[Held], rng: random.Random) -> None:
    """A tick: a byte more of every trickle; note the sockets the server closed; hang up on answers."""
    now = time.monotonic()
    readable, _, _ = select.select([h.sock for h in held if h.cut_at is None], [], [], 0)
    for h in held:
        if h.cut_at is not None:
            continue
        if h.sock in readable:
            try:
                data = h.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                h.cut_at = now
                continue
            if h.kind == "mid-response" and rng.random() < 0.7:
                h.sock.close()   # hung up in the middle of the answer
                h.cut_at = now
                continue
        if h.sent < len(h.trickle):
            try:
                h.sock.send(h.trickle[h.sent:h.sent + 1])
                h.sent += 1
            except OSError:
                h.cut_at = now


def _check_cut(result: ConnectionCampaign, held: list[Held], limits: Limits, number: int) -> None:
    """Every head that never completed was cut within the head timeout and a second (the flood's own
    sockets may have been evicted sooner: earlier is fine)."""
    late = [h for h in held if h.kind in CUT_BY_HEAD_TIMEOUT
            and (h.cut_at is None or h.cut_at - h.opened > limits.head_timeout_s + 1)]
    if late:
        kinds = Counter(h.kind for h in late)
        result.findings.append(f"head-timeout: round {number}: {sum(kinds.values())} heads not cut within "
                               f"{limits.head_timeout_s + 1:g} s ({dict(kinds)})")


def _health(result: ConnectionCampaign, server: tuple[str, int], number: int) -> None:
    started = time.monotonic()
    status = _request(*server, "GET", "/health", None, None, HEALTH_DEADLINE_S)
    took = time.monotonic() - started
    result.health_probes += 1
    result.health_worst_s = max(result.health_worst_s, took)
    if status != 200 or took > HEALTH_DEADLINE_S:
        result.findings.append(f"health: round {number}: {status or 'no answer'} in {took:.2f} s")


def _completion(host: str, port: int, key: str | None) -> bool:
    body = json.dumps({"prompt": "Hi", "max_tokens": 2, "temperature": 0}).encode()
    return _request(host, port, "POST", "/v1/completions", body, key, 60) == 200


def _request(host: str, port: int, method: str, path: str, body: bytes | None, key: str | None,
             timeout: float) -> int | None:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _check_flat(result: ConnectionCampaign) -> None:
    for name, samples in (("descriptors", result.fds), ("RSS", result.rss_kib)):
        if len(samples) >= 2 and samples[-1] > samples[0] * (1 + FLAT) + (FD_SLACK if name == "descriptors" else 0):
            result.findings.append(f"growth: {name} {samples[0]} -> {samples[-1]} from the first round to the last")


def _reclaimed(pid: int, baseline: int | None) -> int:
    """The server's open descriptors once it has closed what the client closed (at most RECLAIM_S)."""
    deadline = time.monotonic() + RECLAIM_S
    count = open_fds(pid)
    while baseline is not None and count > baseline and time.monotonic() < deadline:
        time.sleep(TICK_S)
        count = open_fds(pid)
    return count


def open_fds(pid: int) -> int:
    """The process's open descriptors (0 when it is gone)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def rss_kib(pid: int) -> int:
    """The process's resident memory in KiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _address(base_url: str) -> tuple[str, int]:
    host, _, port = base_url.removeprefix("http://").rstrip("/").removesuffix("/v1").rpartition(":")
    host = host.strip("[]")
    if not is_loopback(host):
        raise ValueError(f"the connection campaign runs against loopback only, not {host!r}")
    return host, int(port)
