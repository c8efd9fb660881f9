"""`bmoe-edge rpc-worker`: llama.cpp's rpc-server, the one built with this engine (same ggml, same RPC
protocol), installed beside the native module as `bmoe_edge/rpc-server`.

It binds 127.0.0.1 unless told otherwise: the RPC protocol has no authentication and no encryption,
so whoever reaches the port can allocate memory on the worker, compute on it and read what it holds.
The main board reaches a worker through an SSH tunnel (docs/rpc.md); another address needs
`insecure=True`, and even then a line says what that means.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.engine import memlimits, native
from bmoe_edge.engine.rpc import DEFAULT_PORT, Endpoint, probe
from bmoe_edge.errors import BmoeError
from bmoe_edge.net import is_loopback

INSECURE_NOTE = ("warning: the RPC protocol has no authentication or encryption: anyone who can reach "
                 "{bind}:{port} can use this worker's memory and CPU and read the weights it holds")


def server_binary() -> Path:
    """The rpc-server installed beside the native module."""
    return native.installed_binary("rpc-server", "rebuild bmoe-edge (the build makes it beside the native module)")


def command(port: int = DEFAULT_PORT, bind: str = "127.0.0.1", threads: int = 0, mem_mb: int = 0,
            insecure: bool = False, wrapper: list[str] | None = None) -> list[str]:
    """The rpc-server command line; BmoeError for a non-loopback bind without `insecure`."""
    if not 0 < port < 65536:
        raise BmoeError(f"--port must be 1-65535, got {port}")
    if not is_loopback(bind) and not insecure:
        raise BmoeError(f"--bind {bind}: the RPC protocol has no authentication or encryption, so the worker "
                        "listens on 127.0.0.1 and the main board comes in through an SSH tunnel; pass "
                        "--insecure-bind to listen there anyway (a network you trust, nobody else on it)")
    argv = [*(wrapper or []), str(server_binary()), "--host", bind, "--port", str(port)]
    if threads > 0:
        argv += ["--threads", str(threads)]
    if mem_mb > 0:  # patch 0003: what the worker reports, and so what a main board places on it
        argv += ["--mem", str(mem_mb)]
    return argv


def reported_mem_mb(mem_mb: int) -> tuple[int, str | None]:
    """What the worker tells main boards it has: `--mem-mb` where given, else the tightest memory limit
    of this process (a service's `MemoryMax=`, a container's cgroup), else 0 (rpc-server reports the
    machine's). A main board places layers by this number, so a worker must never report more than its
    cgroup lets it hold: a larger `--mem-mb` is clamped, with the note saying so."""
    limit = memlimits.tightest_limit()
    if limit is None:
        return mem_mb, None
    if mem_mb == 0:
        return limit.mb, f"rpc-worker: reporting {limit.mb} MiB, the memory limit of {limit.source}"
    if mem_mb > limit.mb:
        return limit.mb, (f"warning: --mem-mb {mem_mb} is more than this process may hold ({limit.mb} MiB, "
                          f"{limit.source}): reporting {limit.mb} MiB")
    return mem_mb, None


def run(argv: list[str], bind: str, port: int) -> None:
    """Replace this process with the server (signals and the exit code are its own)."""
    if not is_loopback(bind):
        print(INSECURE_NOTE.format(bind=bind, port=port), file=sys.stderr)
    print(f"rpc-worker: {' '.join(argv)}", file=sys.stderr, flush=True)
    try:
        os.execvp(argv[0], argv)  # an exec wrapper (qemu-aarch64) is found on PATH
    except OSError as exc:
        raise BmoeError(f"cannot start {argv[0]}: {exc.strerror}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalWorker:
    """An rpc-server process on this machine's loopback."""

    endpoint: Endpoint
    proc: subprocess.Popen


@contextlib.contextmanager
def local_workers(n: int, mem_mb: int = 0, threads: int = 1, log_dir: Path | None = None,
                  timeout: float = 30.0) -> Iterator[list[LocalWorker]]:
    """`n` rpc-servers on 127.0.0.1, each its own process (the gates' RPC cells, tests): started, probed
    until they answer, stopped at the end."""
    workers: list[LocalWorker] = []
    try:
        for _ in range(n):
            workers.append(start_worker(free_port(), mem_mb, threads, log_dir))
        for w in workers:
            wait_ready(w, timeout)
        yield workers
    finally:
        for w in workers:
            stop_worker(w)


def start_worker(port: int, mem_mb: int = 0, threads: int = 1, log_dir: Path | None = None) -> LocalWorker:
    out = open(log_dir / f"rpc-worker-{port}.log", "ab") if log_dir else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(command(port, "127.0.0.1", threads, mem_mb), stdout=out, stderr=out)
    return LocalWorker(Endpoint("127.0.0.1", port), proc)


def stop_worker(w: LocalWorker) -> None:
    w.proc.terminate()
    try:
        w.proc.wait(10)
    except subprocess.TimeoutExpired:
        w.proc.kill()
        w.proc.wait()


def wait_ready(w: LocalWorker, timeout: float = 30.0) -> None:
    """Until the worker answers its probe; BmoeError when it exits or stays silent."""
    protocol = native.load().build_info().rpc_protocol
    deadline = time.monotonic() + timeout
    while True:
        if w.proc.poll() is not None:
            raise BmoeError(f"rpc-server on {w.endpoint} exited with {w.proc.returncode} at start")
        try:
            probe(w.endpoint, protocol, timeout=2.0)
            return
        except BmoeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def endpoints(workers: list[LocalWorker]) -> str:
    """The `--rpc` value of these workers."""
    return ",".join(str(w.endpoint) for w in workers)
