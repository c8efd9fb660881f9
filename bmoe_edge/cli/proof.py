"""`bmoe-edge gates`: the byte-identity gates here, on a bundle under qemu, or on a board."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from bmoe_edge.cli.common import AcceptNewOpt, HostOpt, InstallDirOpt, SshConfigOpt, app
from bmoe_edge.proof import gates


@app.command("gates")
def gates_cmd(
    quick: Annotated[bool, typer.Option("--quick", help="The representative subset (slow targets).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The report as JSON.")] = False,
    fixtures: Annotated[Path | None, typer.Option(
        "--fixtures", envvar="BMOE_EDGE_FIXTURES",
        help="Use a bundle's fixtures directory (then the quick matrix unless --full).")] = None,
    board: Annotated[str | None, typer.Option("--board", help="Run dist/<board>'s build under qemu (quick).")] = None,
    full: Annotated[bool, typer.Option("--full", help="The whole matrix (with --host or --fixtures).")] = False,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="Only the first N cells (a smoke check: "
                                              "deploy's health check runs one).")] = None,
    host: HostOpt = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
) -> None:
    """Streamed == resident, token ids and every step's logits, over the gate matrix.

    With --host, the current release's gates run on the board with its bundled fixtures (quick matrix
    unless --full) and the report comes back."""
    if host:
        from bmoe_edge.fleet import onboard, remote

        options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
        code, out = onboard.board_gates(remote.parse_target(host), options=options, full=full, as_json=as_json,
                                       board_name=board, install_dir=install_dir)
        if as_json:
            typer.echo(out.rstrip("\n"))
        raise typer.Exit(code)
    quick = quick or (fixtures is not None and not full)
    if board:
        from bmoe_edge.boards import emulate

        result = emulate.run_bundle(Path("dist") / board, gates.emulated_gate_args(Path("dist") / board, as_json))
        raise typer.Exit(emulate.exit_code(result.returncode))
    cells = gates.quick_matrix() if quick else gates.full_matrix()
    cells = cells[:limit] if limit else cells
    steps = gates.QUICK_STEPS if quick else gates.STEPS
    results = []
    for result in gates.run_gates(cells, gates.fixture_resolver(fixtures), steps):
        results.append(result)
        if not as_json:
            typer.echo(gates.format_result(result))
    failed = sum(not r.passed for r in results)
    if as_json:
        typer.echo(json.dumps({"passed": len(results) - failed, "failed": failed,
                               "cells": [gates.as_record(r) for r in results]}, indent=2))
    else:
        typer.echo(f"gates: {len(results) - failed} passed, {failed} failed")
    if failed:
        raise typer.Exit(1)
