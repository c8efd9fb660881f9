"""Commands of the deploy stage: deploy, rollback, status (one board or a fleet)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from bmoe_edge.cli.common import AcceptNewOpt, InstallDirOpt, SshConfigOpt, app, fail, serve_options
from bmoe_edge.engine import serve_options as serve_rows
from bmoe_edge.engine.serve_options import reaching

HostsOpt = Annotated[list[str] | None, typer.Option(
    "--host", help="A board over SSH: USER@HOST[:PORT] (repeatable: a fleet, in parallel).")]
InventoryOpt = Annotated[Path | None, typer.Option(
    "--inventory", help="YAML: `hosts:` with their board names and optional user/port/install_dir.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="The per-host report as JSON.")]


def _fleet_output(results: list, as_json: bool) -> None:
    from bmoe_edge.fleet import report

    if as_json:
        typer.echo(report.report_json(results))
    elif len(results) == 1 and results[0].ok:
        typer.echo(report.format_one(results[0]))
    elif len(results) == 1:
        fail(results[0].error or "failed")
    else:
        typer.echo(report.format_table(results))
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@app.command("deploy")
@serve_options(reaching("service"), help_prefix="With --service serve: ", given_only=True)
def deploy_cmd(
    board: Annotated[str | None, typer.Option("--board", help="Deploy dist/<board> (hosts without a board in "
                                              "the inventory are this board).")] = None,
    host: HostsOpt = None,
    inventory: InventoryOpt = None,
    bundle_dir: Annotated[Path | None, typer.Option("--bundle", help="Deploy this bundle directory.")] = None,
    dist: Annotated[Path, typer.Option("--dist", help="Where bundles are: DIST/<board>.")] = Path("dist"),
    run_gates: Annotated[bool, typer.Option("--gates", help="Run the quick gates on the board before switching; "
                                            "any failing cell leaves `current` where it was.")] = False,
    keep: Annotated[int, typer.Option("--keep", min=1, help="Releases kept on the board (plus current and "
                                      "previous).")] = 5,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    as_json: JsonOpt = False,
    max_parallel: Annotated[int | None, typer.Option("--max-parallel", min=1, help="Hosts deployed at once "
                                                     "(default: all, up to 16).")] = None,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="After the first failed host, start no "
                                            "other (those are reported as skipped).")] = False,
    host_timeout: Annotated[float, typer.Option("--host-timeout", min=1, help="Seconds a host may take; "
                                                "then its connection is closed and it fails.")] = 4 * 3600.0,
    lock_timeout: Annotated[float, typer.Option("--lock-timeout", min=0, help="Seconds to wait for another "
                                                "deploy or rollback on the same board.")] = 900.0,
    trust_key: Annotated[Path | None, typer.Option("--trust-key", help="Make the board trust bundles signed by "
                                                   "this public key (the builder's: ~/.config/bmoe-edge/signing/"
                                                   "bundle_ed25519.pub).")] = None,
    allow_unsigned: Annotated[bool, typer.Option("--allow-unsigned", help="Deploy a bundle that is not signed "
                                                 "(a signed one is still checked against the keys the board "
                                                 "trusts).")] = False,
    allow_downgrade: Annotated[bool, typer.Option("--allow-downgrade", help="Deploy a bundle built before the "
                                                  "board's current release (else refused: `rollback` goes back "
                                                  "to a kept release).")] = False,
    service: Annotated[str | None, typer.Option("--service", help="Then install, enable and start this systemd "
                                                "service on the board (serve) and wait for its health answer.")] = None,
    model: Annotated[str | None, typer.Option("-m", "--model", help="With --service: the model's path on the "
                                              "board.")] = None,
    bind: Annotated[str, typer.Option("--bind", help="With --service: the address it listens on, on the board.")]
        = "127.0.0.1",
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535, help="With --service: its port "
                                             "(serve: 8080).")] = None,
    api_key_file: Annotated[Path | None, typer.Option("--api-key-file", help="With --service serve: every "
                                                      "request needs this key (kept 0600 on the board).")] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="With --service serve: no API key, on purpose (an old "
                                          "one is removed; beyond loopback anyone who reaches the port may use "
                                          "it).")] = False,
    *,
    serve: dict[str, Any],
) -> None:
    """Upload a bundle to boards over SSH, verify it there, install it, switch `current` atomically."""
    from bmoe_edge.fleet import deploy, services, trust

    spec = None
    given = serve_rows.given(serve)
    if service is not None:
        keys = serve_rows.read_api_keys(api_key_file) if api_key_file is not None else ()
        spec = services.spec_for(service, model=model, bind=bind, port=port, api_key="\n".join(keys) or None,
                                 serve=given, no_auth=no_auth)
    elif model or api_key_file or port is not None or no_auth or given:
        flags = ["-m", "--port", "--api-key-file", "--no-auth", *(o.flag for o in reaching("service"))]
        fail(f"{', '.join(flags)} go with --service")

    default_host = None
    if not host and inventory is None and (board or bundle_dir):
        from bmoe_edge.boards import bundle
        from bmoe_edge.fleet import probe

        where = bundle_dir or dist / str(board)
        m = bundle.load_manifest(where)
        ssh = (probe.checkout_profile(m.board) or bundle.bundle_profile(where, m)).ssh
        if ssh.host:
            default_host = f"{ssh.host}:{ssh.port}" if ssh.port else ssh.host
    targets = deploy.resolve_targets(host or [], inventory, board, default_host)
    results = deploy.deploy(bundle_dir, targets, board=board, dist=dist, keep=keep, gates=run_gates,
                            accept_new_host_key=accept_new_host_key, ssh_config=ssh_config, install_dir=install_dir,
                            max_parallel=max_parallel, fail_fast=fail_fast, host_timeout=host_timeout,
                            lock_timeout=lock_timeout,
                            trust=trust.TrustOptions(trust_key, allow_unsigned, allow_downgrade), service=spec)
    _fleet_output(results, as_json)


def _on_boards(name: str, doc: str) -> None:
    """Register a per-host command over the targets (rollback, status) that prints the fleet table."""

    def command(
        host: HostsOpt = None,
        inventory: InventoryOpt = None,
        board: Annotated[str | None, typer.Option("--board",
                                                  help="Profile for the login/install dir defaults.")] = None,
        install_dir: InstallDirOpt = None,
        ssh_config: SshConfigOpt = None,
        accept_new_host_key: AcceptNewOpt = False,
        as_json: JsonOpt = False,
    ) -> None:
        from bmoe_edge.fleet import deploy, releases, remote

        options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
        action = getattr(releases, name)
        results = action(deploy.resolve_targets(host or [], inventory, board), options=options,
                         board_name=board, install_dir=install_dir)
        _fleet_output(results, as_json)

    command.__doc__ = doc
    app.command(name)(command)


_on_boards("rollback", "Switch `current` back to the previous release on the board(s), atomically (after "
           "verifying it).")
_on_boards("status", "What runs on the board(s): current release, bundle id, board, when deployed, last gate result.")


@app.command("push-model")
def push_model_cmd(
    model: Annotated[Path, typer.Argument(help="The gguf (the first shard of a split model: all shards go).")],
    host: HostsOpt = None,
    inventory: InventoryOpt = None,
    to: Annotated[str | None, typer.Option("--to", help="Where on the board: a file path, or a directory ending "
                                           "in / (default: <install_dir>/models/).")] = None,
    board: Annotated[str | None, typer.Option("--board", help="Profile for the login/install dir defaults.")] = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    as_json: JsonOpt = False,
    max_parallel: Annotated[int | None, typer.Option("--max-parallel", min=1, help="Hosts at once.")] = None,
) -> None:
    """Copy a model to boards resumably, verify its sha256 there, and swap it in by rename."""
    from bmoe_edge.fleet import deploy, models, remote

    options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
    results = models.push_model(model, deploy.resolve_targets(host or [], inventory, board), options=options, to=to,
                                board_name=board, install_dir=install_dir, max_parallel=max_parallel)
    _fleet_output(results, as_json)
