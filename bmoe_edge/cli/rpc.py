"""`rpc-worker`: lend this machine's memory and CPU to a main board's run (llama.cpp's rpc-server)."""

from __future__ import annotations

from typing import Annotated

import typer

from bmoe_edge.cli.common import app
from bmoe_edge.engine import rpc_worker
from bmoe_edge.engine.rpc import DEFAULT_PORT


@app.command("rpc-worker")
def rpc_worker_cmd(
    port: Annotated[int, typer.Option("--port", help="TCP port to listen on.")] = DEFAULT_PORT,
    bind: Annotated[str, typer.Option("--bind", help="Address to listen on (loopback: reached through an SSH "
                                      "tunnel).")] = "127.0.0.1",
    threads: Annotated[int, typer.Option("--threads", min=0, help="Compute threads (0: llama.cpp's default).")] = 0,
    mem_mb: Annotated[int, typer.Option("--mem-mb", min=0, help="Report at most this many MiB to the main board, "
                                        "which places layers by it (0: this process's memory limit, e.g. "
                                        "the service's MemoryMax, else the machine's memory).")] = 0,
    insecure_bind: Annotated[bool, typer.Option(
        "--insecure-bind", help="Allow a non-loopback --bind: RPC has no authentication or encryption.")] = False,
    board: Annotated[str | None, typer.Option("--board", help="This machine's board profile (default: the "
                                              "deployed board's, else host): an emulated board's server runs "
                                              "through its exec wrapper.")] = None,
) -> None:
    """Run llama.cpp's rpc-server (the one built with this engine) until stopped: a main board's `generate
    --rpc` places whole layers here (docs/rpc.md). `deploy --service rpc-worker` runs it under systemd."""
    from bmoe_edge.boards import profiles

    reported, note = rpc_worker.reported_mem_mb(mem_mb)
    if note:
        typer.echo(note, err=True)
    argv = rpc_worker.command(port, bind, threads, reported, insecure_bind, wrapper=profiles.exec_prefix_here(board))
    rpc_worker.run(argv, bind, port)
