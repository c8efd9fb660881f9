"""`bmoe-edge rpc-worker`: llama.cpp's rpc-server, the one built with this engine (same ggml, same RPC
protocol), installed beside the native module as `bmoe_edge/rpc-server`.

It binds 127.0.0.1 unless told otherwise: the RPC protocol has no authentication and no encryption,
so whoever reaches the port can allocate memory on the worker, compute on it and read what it holds.
The main board reaches a worker through an SSH tunnel (docs/rpc.md); another address needs
`insecure=True`, and even then a line says what that means.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from bmoe_edge.engine import native
from bmoe_edge.engine.rpc import DEFAULT_PORT, is_loopback
from bmoe_edge.errors import BmoeError

INSECURE_NOTE = ("warning: the RPC protocol has no authentication or encryption: anyone who can reach "
                 "{bind}:{port} can use this worker's memory and CPU and read the weights it holds")


def server_binary() -> Path:
    """The rpc-server installed beside the native module (a wheel unpacked without its file modes gets
    its executable bit back here)."""
    module = getattr(native.load(), "__file__", None)
    path = Path(module).parent / "rpc-server" if module else None
    if path is None or not path.is_file():
        raise BmoeError(f"this installation has no rpc-server (looked for {path}): rebuild bmoe-edge "
                        "(the build makes it beside the native module)")
    if not os.access(path, os.X_OK):
        try:
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        except OSError as exc:
            raise BmoeError(f"{path} is not executable and cannot be made so ({exc.strerror})") from None
    return path


def command(port: int = DEFAULT_PORT, bind: str = "127.0.0.1", threads: int = 0, insecure: bool = False,
            cache: bool = False, wrapper: list[str] | None = None) -> list[str]:
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
    if cache:
        argv.append("--cache")
    return argv


def run(argv: list[str], bind: str, port: int) -> None:
    """Replace this process with the server (signals and the exit code are its own)."""
    if not is_loopback(bind):
        print(INSECURE_NOTE.format(bind=bind, port=port), file=sys.stderr)
    print(f"rpc-worker: {' '.join(argv)}", file=sys.stderr, flush=True)
    os.execv(argv[0], argv)
