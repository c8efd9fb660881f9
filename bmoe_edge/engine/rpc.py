"""llama.cpp RPC workers, seen from the main process: endpoints, and a probe of each before any load.

ggml-rpc aborts the whole process on a worker it cannot reach or speak to, so every worker is asked
here first, with the standard library and a deadline: the HELLO handshake (the protocol version must
be this build's), the device count and the free memory (what the layer placement divides). One line
names the worker that fails. The protocol (ggml-rpc.cpp): a command is `cmd:u8 | size:u64 | bytes`,
a reply `size:u64 | bytes`; rpc-server serves one client at a time.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from bmoe_edge.engine import native
from bmoe_edge.errors import BmoeError
from bmoe_edge.net import is_loopback

DEFAULT_PORT = 50052
_HELLO, _DEVICE_COUNT, _GET_DEVICE_MEMORY = 14, 15, 11
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport capabilities; zeros ask for plain TCP


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


@dataclass(frozen=True)
class Worker:
    endpoint: Endpoint
    protocol: str      # "major.minor.patch"
    devices: int
    free_bytes: int
    total_bytes: int


def parse_endpoints(text: str) -> list[Endpoint]:
    """`host:port[,host:port...]` -> endpoints, by the engine's own parser (a bad entry is one line)."""
    with native.engine_errors():
        items = native.load().parse_endpoints(text)
    return [Endpoint(host.strip("[]"), int(port)) for host, _, port in (item.rpartition(":") for item in items)]


def parse_split(text: str, n_workers: int) -> list[float]:
    """`--rpc-split W0,W1,...`: this machine's share of the layers first, then each worker's."""
    with native.engine_errors():
        weights = list(native.load().parse_weights(text))
    if len(weights) != n_workers + 1:
        raise BmoeError(f"--rpc-split needs {n_workers + 1} weights (this machine first, then each of {n_workers} "
                        f"worker(s)), got {len(weights)}")
    return weights


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the worker closed the connection")
        data += chunk
    return data


def _call(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != reply_size:
        raise ConnectionError(f"unexpected reply size {size} to command {cmd}")
    return _recv_exact(sock, size)


def probe(endpoint: Endpoint, protocol: str, timeout: float = 10.0) -> Worker:
    """Ask one worker; BmoeError naming it when it is unreachable, silent, of another protocol version or
    without a device."""
    where = f"RPC worker {endpoint}"
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            major, minor, patch = struct.unpack("<BBB", _call(sock, _HELLO, bytes(_CONN_CAPS), 4 + _CONN_CAPS)[:3])
            theirs = f"{major}.{minor}.{patch}"
            ours = tuple(int(x) for x in protocol.split("."))
            # ggml-rpc's own rule: the same major version, a minor version no newer than ours
            if major != ours[0] or minor > ours[1]:
                raise BmoeError(f"{where} speaks RPC protocol {theirs}, this build {protocol} (another llama.cpp "
                                "version): deploy the same bmoe-edge release there")
            (devices,) = struct.unpack("<I", _call(sock, _DEVICE_COUNT, b"", 4))
            if devices == 0:
                raise BmoeError(f"{where} has no device to compute on")
            free, total = struct.unpack("<QQ", _call(sock, _GET_DEVICE_MEMORY, struct.pack("<I", 0), 16))
    except BmoeError:
        raise
    except TimeoutError:
        raise BmoeError(f"{where} did not answer within {timeout:g} s (an rpc-server serves one client at a "
                        "time: is another run using it?)") from None
    except ConnectionRefusedError:
        raise BmoeError(f"{where} refused the connection: start it there (bmoe-edge rpc-worker --port "
                        f"{endpoint.port})") from None
    except (OSError, ConnectionError, struct.error) as exc:
        raise BmoeError(f"{where} is not reachable or not an RPC worker ({exc})") from None
    return Worker(endpoint, theirs, devices, free, total)


def probe_all(endpoints: list[Endpoint], protocol: str, timeout: float = 10.0) -> list[Worker]:
    return [probe(e, protocol, timeout) for e in endpoints]
