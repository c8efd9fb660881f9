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
bench_app = typer.Typer(help="Benchmarks: drive bandwidth, streamed vs llama.cpp mmap under a RAM cap, routing.",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


# Reaching boards over SSH (deploy, rollback, status, gates/generate --host); the logic is in deploy.py.
HostOpt = Annotated[str | None, typer.Option("--host", help="Run it on this board over SSH: USER@HOST[:PORT].")]
InstallDirOpt = Annotated[str | None, typer.Option(
    "--install-dir", help="Where releases live on the board (default: the inventory's, the profile's "
    "ssh.install_dir, or where the last deploy went).")]
SshConfigOpt = Annotated[Path | None, typer.Option(
    "--ssh-config", envvar="BMOE_EDGE_SSH_CONFIG", help="Read this ssh config instead of ~/.ssh/config "
    "(like ssh -F).")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-key", help="Accept and record the key of a host not in known_hosts (never a changed one).")]


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
    arch: Annotated[str | None, typer.Option("--arch", help=f"One of: {', '.join(tinymoe.ARCHS)}.")] = None,
    quant: Annotated[str | None, typer.Option("--quant", help=f"One of: {', '.join(tinymoe.QUANTS)}.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="The gguf to write.")] = None,
    split: Annotated[int, typer.Option("--split", help="Write N shards <stem>-0000i-of-0000N.gguf.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random weights.")] = 0,
    preset: Annotated[str | None, typer.Option("--preset", help="A benchmark-sized model: qwen3-30b-a3b-2g|3g|6g|8g "
                                               "(default output under $BMOE_EDGE_CACHE/bench/).")] = None,
    routing_skew: Annotated[float, typer.Option("--routing-skew", help="--preset: Zipf exponent of expert "
                                                "popularity, with repeats across neighbouring tokens; 0 = random "
                                                "router (uniform).")] = 0.0,
    routing_repeat: Annotated[float | None, typer.Option("--routing-repeat", help="--preset: previous-token "
                                                         "expert reuse of a shaped router (default 0.4).")] = None,
    layers: Annotated[int | None, typer.Option("--layers", help="--preset: layers (~0.13 GB each).")] = None,
    vocab_size: Annotated[int | None, typer.Option("--vocab-size", help="--preset: vocabulary (default 4096).")] = None,
) -> None:
    """Write a tiny synthetic MoE gguf (8 experts, top-2, 4 layers, a real small tokenizer), or with
    --preset a benchmark-sized one written tensor by tensor."""
    if preset is not None:
        from bmoe_edge import bigmoe

        q = quant or "Q4_0"
        if output is None:
            tag = f"skew{routing_skew:g}" + ("" if routing_repeat is None else f"-rep{routing_repeat:g}")
            size = "" if layers is None else f"-{layers}l"
            output = llama_source.cache_dir() / "bench" / f"{preset}{size}-{q}-{tag}.gguf"
        written = bigmoe.write_preset(output, preset, q, routing_skew=routing_skew, routing_repeat=routing_repeat,
                                      seed=seed, n_layer=layers, vocab_size=vocab_size,
                                      progress=lambda s: typer.echo(f"  {s}", err=True))
        typer.echo(bigmoe.describe(written))
        return
    if arch is None or quant is None or output is None:
        fail("tiny-model needs --arch, --quant and -o (or --preset)")
    for path in tinymoe.write_tiny_moe(output, arch, quant, seed=seed, split=split):
        typer.echo(str(path))


@app.command("archs")
def archs_cmd() -> None:
    """The architectures the engine can stream: the recipe table (general.architecture -> expert tensors).

    "gated" rows have a synthetic fixture and pass the byte-identity gates; the others follow the same
    graph shape in llama.cpp but have no fixture yet.
    """
    for recipe in info.recipes():
        gated = "gated" if recipe.architecture in gates.ARCHS_WITH_FIXTURES else "untested"
        typer.echo(f"{recipe.architecture:<12} {gated:<9} {', '.join(recipe.expert_suffixes):<40} {recipe.note}")


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
    host: HostOpt = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
) -> None:
    """Generate text headlessly, streaming the routed experts from flash (greedy by default).

    With --host, it runs on the board through its current release (-m is a path on the board, the
    deployed board profile gives the defaults) and the tokens stream back as they come."""
    if host:
        from bmoe_edge import deploy, remote

        args = deploy.generate_args(
            max_tokens=max_tokens, temp=temp, top_k=top_k, top_p=top_p, seed=seed, as_json=as_json,
            progress=progress, csv_path=None if csv_path is None else str(csv_path),
            overrides={"stream": stream, "cache_mb": cache_mb, "cache_floor_mb": cache_floor_mb,
                       "cache_ceil_mb": cache_ceil_mb, "io_threads": io_threads, "read_path": read_path,
                       "dense": dense, "overlap": overlap, "threads": threads, "ctx": ctx})
        options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
        raise typer.Exit(deploy.board_generate(remote.parse_target(host), str(model), prompt, args, options=options,
                                               board_name=board, install_dir=install_dir))
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
    fixtures: Annotated[Path | None, typer.Option(
        "--fixtures", envvar="BMOE_EDGE_FIXTURES",
        help="Use a bundle's fixtures directory (then the quick matrix unless --full).")] = None,
    board: Annotated[str | None, typer.Option("--board", help="Run dist/<board>'s build under qemu (quick).")] = None,
    full: Annotated[bool, typer.Option("--full", help="The whole matrix (with --host or --fixtures).")] = False,
    host: HostOpt = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
) -> None:
    """Streamed == resident, token ids and every step's logits, over the gate matrix.

    With --host, the current release's gates run on the board with its bundled fixtures (quick matrix
    unless --full) and the report comes back."""
    if host:
        from bmoe_edge import deploy, remote

        options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
        code, out = deploy.board_gates(remote.parse_target(host), options=options, full=full, as_json=as_json,
                                       board_name=board, install_dir=install_dir)
        if as_json:
            typer.echo(out.rstrip("\n"))
        raise typer.Exit(code)
    quick = quick or (fixtures is not None and not full)
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


@app.command("tune")
def tune_cmd(
    board: Annotated[str | None, typer.Option("--board", help="The board profile to extend (default: the "
                                              "deployed release's board, else host).")] = None,
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
    from bmoe_edge import tune

    if host:
        from bmoe_edge import remote

        options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
        result = tune.tune_remote(remote.parse_target(host), options=options, board=board, install_dir=install_dir,
                                  model=None if model is None else str(model), out=out, quick=quick,
                                  scratch_dir=None if scratch_dir is None else str(scratch_dir),
                                  progress=tune.stderr_progress)
    else:
        result = tune.tune_local(board, model=model, out=out, quick=quick, scratch_dir=scratch_dir,
                                 write=not no_write, progress=tune.stderr_progress)
    typer.echo(result.to_json() if as_json else tune.format_table(result))


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


@bench_app.command("io")
def bench_io_cmd(
    model: Annotated[Path, typer.Option("-m", "--model", help="Read this file (a gguf: its slice size is added).")],
    sizes: Annotated[str, typer.Option("--sizes", help="Read sizes: bytes, 64k, 4m, or slice.")] = "4k,64k,slice,1m,4m",
    lanes: Annotated[str, typer.Option("--lanes", help="Lane counts.")] = "1,4",
    modes: Annotated[str, typer.Option("--modes", help="odirect, pread.")] = "odirect,pread",
    seconds: Annotated[float, typer.Option("--seconds", help="Per cell (at most; or the file runs out).")] = 3.0,
    repeats: Annotated[int, typer.Option("--repeats", min=1)] = 1,
    out: Annotated[Path | None, typer.Option("--out", help="Write io.csv and io.md here.")] = None,
) -> None:
    """Raw random-read bandwidth of the model's drive, cold, at the engine's slice sizes and lane counts."""
    from bmoe_edge import bench

    rows = bench.bench_io(model, out, sizes=list(bench.iter_sizes(sizes, model)),
                          lanes=[int(x) for x in lanes.split(",")], modes=[m.strip() for m in modes.split(",")],
                          seconds=seconds, repeats=repeats)
    typer.echo(bench.io_summary(rows), nl=False)


@bench_app.command("stream")
def bench_stream_cmd(
    model: Annotated[Path, typer.Option("-m", "--model", help="The gguf (a single file).")],
    ram_cap: Annotated[str, typer.Option("--ram-cap", help="PCT% of the model file, or MiB.")],
    tokens: Annotated[int, typer.Option("--tokens", min=2, help="Generated tokens per cell.")] = 256,
    mmap_tokens: Annotated[int | None, typer.Option("--mmap-tokens", help="For the (slow) mmap cell.")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1)] = 3,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("bench-out"),
    threads: Annotated[int, typer.Option("-t", "--threads", help="Compute threads of every cell.")] = 1,
    cells: Annotated[str | None, typer.Option("--cells", help="Only these labels (comma list).")] = None,
    budgets: Annotated[str | None, typer.Option("--budgets", help="Cache budgets, MiB (default: by cap).")] = None,
    cap_method: Annotated[str, typer.Option("--cap-method", help="auto, cgroup-v1, cgroup-v2, balloon.")] = "auto",
    io_seconds: Annotated[float, typer.Option("--io-seconds", help="bench io per cell per repeat (0 = none).")] = 2.0,
    routing_tokens: Annotated[int, typer.Option("--routing-tokens", help="Trace the routing first (strace).")] = 0,
    host: Annotated[str | None, typer.Option("--host", help="Run on a board (not implemented here).")] = None,
) -> None:
    """Streamed vs llama.cpp mmap under a RAM cap, interleaved and repeated: CSVs, summary.md, plots."""
    from bmoe_edge import bench

    if host:
        fail("--host is not implemented yet: copy the model and run `bmoe-edge bench stream` on the board")
    layout = bench.gguf_layout(model)
    cap = bench.parse_cap(ram_cap, layout.file_bytes)
    matrix = bench.default_cells(layout, cap, tokens=tokens, mmap_tokens=mmap_tokens or tokens, threads=threads,
                                 budgets_mb=[float(b) for b in budgets.split(",")] if budgets else None)
    if cells:
        wanted = [c.strip() for c in cells.split(",")]
        unknown = sorted(set(wanted) - {c.label for c in matrix})
        if unknown:
            fail(f"unknown cells {', '.join(unknown)} (known: {', '.join(c.label for c in matrix)})")
        matrix = [c for c in matrix if c.label in wanted]
    bench.stream_campaign(bench.Campaign(model, out, cap, cap_method, matrix, repeats, io_seconds=io_seconds,
                                         routing_tokens=routing_tokens))
    typer.echo(bench.write_summary(out).read_text(), nl=False)


@bench_app.command("summary")
def bench_summary_cmd(out: Annotated[Path, typer.Argument(help="A bench stream output directory.")]) -> None:
    """Rewrite summary.md, targets.json and the plots of a finished campaign."""
    from bmoe_edge import bench

    typer.echo(bench.write_summary(out).read_text(), nl=False)


@bench_app.command("routing")
def bench_routing_cmd(
    model: Annotated[Path, typer.Option("-m", "--model")],
    tokens: Annotated[int, typer.Option("--tokens", min=2)] = 64,
    out: Annotated[Path, typer.Option("--out")] = Path("bench-out"),
) -> None:
    """Which experts the engine reads, per token and layer (strace of a cache-off run): popularity, reuse."""
    from bmoe_edge import bench

    stats = bench.routing_report(model, tokens, out)
    typer.echo(json.dumps({k: v for k, v in stats.items() if k != "mean_ranked_freq"}, indent=2))


@bench_app.command("cell", hidden=True)
def bench_cell_cmd(spec: Annotated[str, typer.Argument(help="The cell as JSON.")]) -> None:
    """One benchmark cell in this process (spawned by `bench stream`); prints one JSON record."""
    from bmoe_edge import bench

    raise typer.Exit(bench.cell_main(spec))


HostsOpt = Annotated[list[str] | None, typer.Option(
    "--host", help="A board over SSH: USER@HOST[:PORT] (repeatable: a fleet, in parallel).")]
InventoryOpt = Annotated[Path | None, typer.Option(
    "--inventory", help="YAML: `hosts:` with their board names and optional user/port/install_dir.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="The per-host report as JSON.")]


def _fleet_output(results: list, as_json: bool) -> None:
    from bmoe_edge import deploy

    if as_json:
        typer.echo(deploy.report_json(results))
    elif len(results) == 1 and results[0].ok:
        typer.echo(deploy.format_one(results[0]))
    elif len(results) == 1:
        fail(results[0].error or "failed")
    else:
        typer.echo(deploy.format_table(results))
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@app.command("deploy")
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
) -> None:
    """Upload a bundle to boards over SSH, verify it there, install it, switch `current` atomically."""
    from bmoe_edge import deploy

    default_host = None
    if not host and inventory is None and (board or bundle_dir):
        from bmoe_edge import bundle

        manifest = bundle.load_manifest(bundle_dir or dist / str(board))
        ssh = manifest.profile.get("ssh") or {}
        if isinstance(ssh, dict) and ssh.get("host"):
            default_host = f"{ssh['host']}:{ssh['port']}" if ssh.get("port") else str(ssh["host"])
    targets = deploy.resolve_targets(host or [], inventory, board, default_host)
    results = deploy.deploy(bundle_dir, targets, board=board, dist=dist, keep=keep, gates=run_gates,
                            accept_new_host_key=accept_new_host_key, ssh_config=ssh_config, install_dir=install_dir)
    _fleet_output(results, as_json)


@app.command("rollback")
def rollback_cmd(
    host: HostsOpt = None,
    inventory: InventoryOpt = None,
    board: Annotated[str | None, typer.Option("--board", help="Profile for the login/install dir defaults.")] = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Switch `current` back to the previous release on the board(s), atomically (after verifying it)."""
    from bmoe_edge import deploy

    _on_boards(deploy.rollback, host, inventory, board, install_dir, ssh_config, accept_new_host_key, as_json)


@app.command("status")
def status_cmd(
    host: HostsOpt = None,
    inventory: InventoryOpt = None,
    board: Annotated[str | None, typer.Option("--board", help="Profile for the login/install dir defaults.")] = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """What runs on the board(s): current release, bundle id, board, when deployed, last gate result."""
    from bmoe_edge import deploy

    _on_boards(deploy.status, host, inventory, board, install_dir, ssh_config, accept_new_host_key, as_json)


def _on_boards(action, host, inventory, board, install_dir, ssh_config, accept_new_host_key, as_json) -> None:
    """Run a per-host deploy action (rollback, status) over the targets and print the fleet table."""
    from bmoe_edge import deploy, remote

    options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
    results = action(deploy.resolve_targets(host or [], inventory, board), options=options,
                     board_name=board, install_dir=install_dir)
    _fleet_output(results, as_json)


def run() -> None:
    """Entry point: expected errors become one line on stderr and exit code 1."""
    try:
        app()
    except BmoeError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    run()
