"""`bmoe-edge gates`: the byte-identity gates here, on a bundle under qemu, or on a board."""

from __future__ import annotations

import contextlib
import itertools
import json
import time
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
    rpc: Annotated[bool, typer.Option("--rpc", help="The RPC cells: two llama.cpp rpc-server workers on loopback "
                                      "hold two thirds of the layers, the rest streams here (docs/rpc.md).")] = False,
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
        from bmoe_edge.fleet.targets import parse_target

        options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
        code, out = onboard.board_gates(parse_target(host), options=options, full=full, as_json=as_json,
                                       board_name=board, install_dir=install_dir)
        if as_json:
            typer.echo(out.rstrip("\n"))
        raise typer.Exit(code)
    quick = quick or (fixtures is not None and not full)
    if board:
        from bmoe_edge.boards import emulate

        result = emulate.run_bundle(Path("dist") / board, gates.emulated_gate_args(Path("dist") / board, as_json))
        raise typer.Exit(emulate.exit_code(result.returncode))
    with contextlib.ExitStack() as stack:
        if rpc:
            from bmoe_edge.engine import rpc_worker

            workers = stack.enter_context(rpc_worker.local_workers(gates.RPC_WORKERS))
            cells = gates.rpc_matrix(rpc_worker.endpoints(workers))
        else:
            cells = gates.quick_matrix() if quick else gates.full_matrix()
        cells = cells[:limit] if limit else cells
        steps = gates.QUICK_STEPS if quick or rpc else gates.STEPS
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


def _write_results(out: Path | None, name: str, records: list[dict], table: str) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"{name}.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    (out / f"{name}.md").write_text(table + "\n")


def _http_fuzz(requests: int, seed: int, out: Path | None, workdir: Path, parallel: int, rounds: int) -> None:
    """The request campaign (its invariants per request, /health and resources throughout), then the connection
    campaign on a fresh server; one record of each, and a non-zero exit on any finding."""
    from bmoe_edge.proof import conn_fuzz, http_fuzz
    from bmoe_edge.synthetic import tinymoe

    model = tinymoe.fixture("qwen3moe", "Q8_0")
    template = http_fuzz.qwen3_template()
    results, vitals = [], http_fuzz.Vitals()
    started = time.monotonic()
    for r in http_fuzz.run_campaign(model, workdir, requests, seed, template=template, parallel=parallel,
                                    vitals=vitals):
        results.append(r)
        if r.outcome not in http_fuzz.PASSING or len(results) % 250 == 0:
            typer.echo(f"[{len(results)}/{requests}] {r.case[:100]} {r.status} {r.outcome} {r.detail[:120]}", err=True)
    problems = vitals.problems()
    table = (http_fuzz.table(results) + f"\n\n{vitals.summary()}\n\nseed {seed}, --parallel {parallel}, "
             f"{time.monotonic() - started:.0f} s")
    connections = None
    if rounds:
        server = http_fuzz.Server(model, template, workdir, parallel)
        server.start()
        try:
            assert server.proc is not None
            connections = conn_fuzz.run_connection_campaign(f"http://127.0.0.1:{server.port}", server.proc.pid,
                                                            rounds=rounds, seed=seed, api_key=http_fuzz.KEY)
        finally:
            server.stop()
        problems += connections.findings
        table += (f"\n\nconnections: {connections.rounds} rounds, sockets {connections.sockets}, /health worst "
                  f"{connections.health_worst_s:.3f} s, findings {len(connections.findings)}")
    typer.echo(table)
    for line in problems:
        typer.echo(f"finding: {line}", err=True)
    records = [r.record() for r in results] + ([{"connections": connections.record()}] if connections else [])
    records.append({"vitals": vitals.summary(), "problems": problems,
                    "rss_kib_fds_every_50": vitals.samples[::50]})   # the curve behind the growth figures
    _write_results(out, "http-fuzz", records, table)
    if problems or any(r.outcome not in http_fuzz.PASSING for r in results):
        raise typer.Exit(1)


@app.command("faults")
def faults_cmd(
    count: Annotated[int, typer.Option("--count", min=1, help="Faults to inject (one engine run each).")] = 1000,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="Write faults.jsonl and faults.md here.")] = None,
    workdir: Annotated[Path, typer.Option("--workdir", help="Scratch directory for the fixture copy.")] =
        Path("/tmp/bmoe-faults"),
) -> None:
    """The fault campaign: corrupt, failed, short and hung reads under random streaming configurations;
    every run must end in an error or in output identical to resident (docs/integrity.md)."""
    from bmoe_edge.proof import faults
    from bmoe_edge.synthetic import tinymoe

    results = []
    campaign = faults.run_campaign(tinymoe.fixture("qwen3moe", "Q8_0"), workdir, count, seed)
    first = next(campaign)  # the process as it is once the first engine has come and gone
    fds, rss = faults.open_fds(), faults.rss_bytes()
    for r in itertools.chain([first], campaign):
        results.append(r)
        if r.outcome == "different" or len(results) % 50 == 0:
            typer.echo(f"[{len(results)}/{count}] {r.case.kind}:{r.case.nth} {r.outcome} {r.detail[:120]}", err=True)
    table = faults.table(results) + (
        f"\n\n{len(results)} engines opened and closed in one process after the first: open descriptors "
        f"{fds} -> {faults.open_fds()}, RSS {rss / 2**20:.1f} -> {faults.rss_bytes() / 2**20:.1f} MiB")
    typer.echo(table)
    _write_results(out, "faults", [r.record() for r in results], table)
    if any(r.outcome == "different" for r in results):
        raise typer.Exit(1)


@app.command("fuzz")
def fuzz_cmd(
    count: Annotated[int, typer.Option("--count", min=1, help="Mutations (each through info and generate).")] = 2000,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    http: Annotated[bool, typer.Option("--http", help="Fuzz `serve` instead: generated requests against a real "
                                       "server on the tiny fixture, each followed by a greedy probe and /health.")]
        = False,
    requests: Annotated[int, typer.Option("--requests", min=1, help="With --http: requests to send.")] = 500,
    parallel: Annotated[int, typer.Option("--parallel", min=1, max=8, help="With --http: the server's --parallel.")]
        = 1,
    rounds: Annotated[int, typer.Option("--connection-rounds", min=0, help="With --http: rounds of the connection "
                                        "campaign after the requests (half-sent heads, trickles, many sockets).")]
        = 20,
    out: Annotated[Path | None, typer.Option("--out", help="Write fuzz.jsonl and fuzz.md here.")] = None,
    workdir: Annotated[Path, typer.Option("--workdir", help="Scratch directory for the mutated files.")] =
        Path("/tmp/bmoe-fuzz"),
) -> None:
    """The fuzz campaign: mutated headers, metadata, tensor tables and truncations of a small fixture
    through info and generate; no run may end by a signal, a hang or an unexpected exception.
    With --http: the server's campaign (bmoe_edge/proof/http_fuzz.py)."""
    if http:
        _http_fuzz(requests, seed, out, workdir, parallel, rounds)
        return
    from bmoe_edge.proof import fuzz

    model = fuzz.seed_model(workdir)
    results = []
    for r in fuzz.run_campaign(model, workdir, count, seed):
        results.append(r)
        if r.outcome not in fuzz.PASSING or len(results) % 200 == 0:
            typer.echo(f"[{len(results)}/{2 * count}] {r.mode} {r.mutation} {r.outcome} {r.detail[:120]}", err=True)
    table = fuzz.table(results)
    typer.echo(table)
    _write_results(out, "fuzz", [r.record() for r in results], table)
    if any(r.outcome not in fuzz.PASSING for r in results):
        raise typer.Exit(1)
