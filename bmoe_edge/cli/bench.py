"""`bmoe-edge bench`: io, stream, summary, routing, and the hidden per-cell command."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

import typer

from bmoe_edge.bench.defaults import PREFILL_CHUNK, SERVE_CTX, THREADS
from bmoe_edge.cli.common import (
    AcceptNewOpt,
    InstallDirOpt,
    SshConfigOpt,
    bench_app,
    fail,
    machine_config,
    setting_options,
)
from bmoe_edge.engine.settings import BY_NAME

BOARD_HELP = ("Run it on this board over SSH (USER@HOST[:PORT]) through its current release: -m is a path on the "
              "board, its own profile applies, the results come back into --out.")
# The options that say where a run happens: never passed on to the board's own command.
_HERE_ONLY = {"host", "install_dir", "ssh_config", "accept_new_host_key", "out", "model"}


def _given_args(ctx: typer.Context) -> list[str]:
    """The options given on this command line (or by their environment variable), as the board's command line:
    a flag left out keeps the board's own default (its profile), never this machine's."""
    args: list[str] = []
    for param in ctx.command.params:
        # typer carries its own copy of click: its classes are matched by what they say, not by isinstance
        source = ctx.get_parameter_source(param.name) if param.name else None
        if param.param_type_name != "option" or param.name in _HERE_ONLY \
                or getattr(source, "name", None) not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        value = ctx.params[param.name]
        flag = max(param.opts, key=len)
        if param.is_flag:
            args += [flag] if value else list(param.secondary_opts[:1])
        else:
            for v in (value if param.multiple else [value]):
                args += [flag, str(v)]
    return args


def _on_board(ctx: typer.Context, host: str, command: list[str], models: list[str], out: Path | None,
              install_dir: str | None, ssh_config: Path | None, accept_new_host_key: bool) -> Any:
    """`bench COMMAND` on the board (fleet.bench_run): its progress streams to stderr, its files come into `out`."""
    # fleet reaches boards with fabric, which a board does not have: imported only when a board is reached
    from bmoe_edge.fleet import bench_run, remote
    from bmoe_edge.fleet.targets import parse_target

    options = remote.SshOptions(ssh_config=ssh_config, accept_new_host_key=accept_new_host_key)
    return bench_run.run_bench(parse_target(host), command, models, _given_args(ctx), out, options=options,
                               install_dir=install_dir)


@bench_app.command("io")
def bench_io_cmd(
    model: Annotated[Path, typer.Option("-m", "--model", help="Read this file (a gguf: its slice size is added).")],
    sizes: Annotated[str, typer.Option("--sizes", help="Read sizes: bytes, 64k, 4m, or slice.")] = "4k,64k,slice,1m,4m",
    lanes: Annotated[str, typer.Option("--lanes", help="Lane counts.")] = "1,4",
    modes: Annotated[str, typer.Option("--modes", help="odirect, pread.")] = "odirect,pread",
    seconds: Annotated[float, typer.Option("--seconds", help="Per cell (at most; or the file runs out).")] = 3.0,
    repeats: Annotated[int, typer.Option("--repeats", min=1)] = 1,
    out: Annotated[Path | None, typer.Option("--out", help="Write io.csv and io.md here.")] = None,
    host: Annotated[str | None, typer.Option("--host", help=BOARD_HELP)] = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    *,
    ctx: typer.Context,
) -> None:
    """Raw random-read bandwidth of the model's drive, cold, at the engine's slice sizes and lane counts.

    With --host, the board's current release measures the board's drive (-m is a path there) and io.csv
    and io.md come back into --out."""
    from bmoe_edge.bench import io

    if host:
        run = _on_board(ctx, host, ["io"], [str(model)], out, install_dir, ssh_config, accept_new_host_key)
        typer.echo(run.stdout, nl=False)
        raise typer.Exit(run.exited)
    rows = io.bench_io(model, out, sizes=list(io.iter_sizes(sizes, model)),
                          lanes=[int(x) for x in lanes.split(",")], modes=[m.strip() for m in modes.split(",")],
                          seconds=seconds, repeats=repeats)
    typer.echo(io.io_summary(rows), nl=False)


def _machine_defaults(tokens: int, board: str | None = None, prompt_tokens: int = 0) -> dict[str, object]:
    """The settings `generate -p PROMPT -n TOKENS` uses with no knobs on this machine (or as `board`'s
    profile sets them), as a cell's config (with `prompt_tokens`: for a prompt of that many tokens)."""
    from bmoe_edge.bench.machine import PROMPT
    from bmoe_edge.engine import settings

    config = machine_config(board, {}, (prompt_tokens or PROMPT, tokens))
    return {name: getattr(config, name) for name in settings.config_fields()}


def storage_targets() -> dict[str, object]:
    """`--storage` names: every storage class (the `_storage-CLASS` fragments) and every board (its
    `storage:`, named by its class where it extends one)."""
    from bmoe_edge.bench.storage import StorageTarget
    from bmoe_edge.boards import profiles

    boards = profiles.load_all()[0]
    named: dict[str, object] = {}
    for name, s in profiles.storage_classes().items():
        # A class's board (the first that extends it) lends the `defaults` cell its profile: the Pi 5's
        # 2 lanes at the Pi 5's classes, not this machine's own.
        board = next((b.name for b in boards if b.storage_class == name and not b.emulated), None)
        named[name] = StorageTarget(name, s.read_mb_s, s.read_iops or 0, s.latency_us, board)
    for b in boards:
        s = b.storage
        named.setdefault(b.name, StorageTarget(b.storage_class or b.name, s.read_mb_s, s.read_iops or 0,
                                               s.latency_us, b.name))
    return named


class _Labelled(Protocol):
    label: str


CellT = TypeVar("CellT", bound=_Labelled)


def _only_cells(matrix: list[CellT], cells: str | None) -> list[CellT]:
    """The matrix's cells named in `cells` (a comma list; None: all), or one line for a name it has not."""
    if not cells:
        return matrix
    wanted = [c.strip() for c in cells.split(",")]
    unknown = sorted(set(wanted) - {c.label for c in matrix})
    if unknown:
        fail(f"unknown cells {', '.join(unknown)} (known: {', '.join(c.label for c in matrix)})")
    return [c for c in matrix if c.label in wanted]


def _long_prompt_configs(tokens: int, board: str | None, lengths: list[int]) -> dict[int, dict[str, object]]:
    """Every long-prompt cell with the settings `generate` picks for the longest prompt (its context and batch):
    the cells then differ by the prompt alone, so decode after a long prompt is compared with the same
    settings after a short one."""
    if not lengths:
        return {}
    config = _machine_defaults(tokens, board, max(lengths))
    return {n: dict(config) for n in lengths}


@bench_app.command("stream")
def bench_stream_cmd(
    model: Annotated[Path, typer.Option("-m", "--model", help="The gguf (a single file; with --host, a path on "
                                        "the board).")],
    ram_cap: Annotated[str, typer.Option("--ram-cap", help="PCT% of the model file, MiB, or none (no cgroup: "
                                         "the machine's own memory, e.g. a board's smaller than the model).")],
    tokens: Annotated[int, typer.Option("--tokens", min=2, help="Generated tokens per cell.")] = 256,
    mmap_tokens: Annotated[int | None, typer.Option("--mmap-tokens", help="For the (slow) mmap cell.")] = None,
    repeats: Annotated[int, typer.Option("--repeats", min=1)] = 3,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("bench-out"),
    threads: Annotated[int, typer.Option(*THREADS.row.flags, help=THREADS.help)] = THREADS.value,
    cells: Annotated[str | None, typer.Option("--cells", help="Only these labels (comma list).")] = None,
    budgets: Annotated[str | None, typer.Option("--budgets", help="Cache budgets, MiB (default: by cap).")] = None,
    cap_method: Annotated[str, typer.Option("--cap-method", help="auto, cgroup-v1, cgroup-v2, balloon.")] = "auto",
    io_seconds: Annotated[float, typer.Option("--io-seconds", help="bench io per cell per repeat (0 = none).")] = 2.0,
    routing_tokens: Annotated[int, typer.Option("--routing-tokens",
                                                help="Trace the routing first (the engine's route trace).")] = 0,
    long_prompts: Annotated[str, typer.Option("--long-prompts", help="The long-prompt cells' prompt lengths, "
                                              "tokens (comma list; empty: none).")] = "16,64,512,2048",
    host: Annotated[str | None, typer.Option("--host", help=BOARD_HELP)] = None,
    storage: Annotated[str, typer.Option("--storage", help="Throttle every cell's reads to a storage class "
                                         "(microsd, rpi5-nvme-gen2, ...), a board's storage (rpi5), MB/s[:IOPS], "
                                         "or native (the drive as it is).")] = "native",
    board: Annotated[str | None, typer.Option("--board", help="The `defaults` cell runs this board's profile "
                                              "(default: the board of --storage, else this machine's).")] = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    *,
    ctx: typer.Context,
) -> None:
    """Streamed vs llama.cpp mmap under a RAM cap, interleaved and repeated: CSVs, summary.md, plots.

    With --host, the campaign runs on the board through its current release (-m is a path there; its profile,
    memory and drive; only the options given here are passed on), detached: its progress streams here, and its
    files come back into --out (plots drawn here). A lost connection leaves it running: the same command again
    with the same --out follows it and fetches it. docs/benchmarks.md: run it on your board and send the card."""
    from bmoe_edge.bench import campaign, layout, ramcap, results
    from bmoe_edge.bench import storage as storage_classes
    from bmoe_edge.boards import profiles

    if host:
        run = _on_board(ctx, host, ["stream"], [str(model)], out, install_dir, ssh_config, accept_new_host_key)
        if run.exited == 0:
            typer.echo(results.write_summary(out).read_text(), nl=False)
        raise typer.Exit(run.exited)
    target = storage_classes.parse_storage(storage, storage_targets())  # type: ignore[arg-type]
    # A Pi 5 with its connector forced to Gen 3 runs the rpi5 profile at a class no shipped board extends.
    board = board or (target.board if target else None)
    defaults = _machine_defaults(tokens, board)
    model_layout = layout.gguf_layout(model)
    cap = ramcap.parse_cap(ram_cap, model_layout.file_bytes)
    matrix = campaign.default_cells(model_layout, cap, tokens=tokens, mmap_tokens=mmap_tokens or tokens,
                                    threads=threads,
                                    budgets_mb=[float(b) for b in budgets.split(",")] if budgets else None,
                                    defaults=defaults,
                                    long_prompts=_long_prompt_configs(tokens, board, _lengths(long_prompts)))
    matrix = _only_cells(matrix, cells)
    # Each cell is a Python of its own, and the anchor a program: on an emulated board (a release under qemu-user)
    # both start through its exec wrapper.
    campaign.stream_campaign(campaign.Campaign(model, out, cap, cap_method, matrix, repeats, io_seconds=io_seconds,
                                         routing_tokens=routing_tokens, storage=target,
                                         wrapper=profiles.exec_prefix_here()))
    typer.echo(results.write_summary(out).read_text(), nl=False)


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"--long-prompts {text!r}: a comma list of token counts")
    if any(n < 2 for n in lengths):
        fail(f"--long-prompts {text!r}: a prompt has at least 2 tokens")
    return lengths


@bench_app.command("serve")
def bench_serve_cmd(
    model: Annotated[list[Path], typer.Option("-m", "--model", help="A gguf (repeatable: the models interleave).")],
    ram_cap: Annotated[str, typer.Option("--ram-cap", help="PCT% of the model file, or MiB.")] = "40%",
    clients: Annotated[str, typer.Option("--clients", help="Concurrent streaming clients (comma list).")] = "1,2,4",
    tokens: Annotated[int, typer.Option("--tokens", min=2, help="Generated tokens per client.")] = 48,
    long_prompt: Annotated[int, typer.Option("--long-prompt", min=0, help="The gap cells' long prompt, tokens "
                                             "(0: none).")] = 2000,
    chunk: Annotated[int, typer.Option(*PREFILL_CHUNK.row.flags, min=1, help=PREFILL_CHUNK.help)] = PREFILL_CHUNK.value,
    repeats: Annotated[int, typer.Option("--repeats", min=1)] = 2,
    threads: Annotated[int, typer.Option(*THREADS.row.flags, help=THREADS.help)] = THREADS.value,
    ctx: Annotated[int, typer.Option(*SERVE_CTX.row.flags, help=SERVE_CTX.help)] = SERVE_CTX.value,
    cells: Annotated[str | None, typer.Option("--cells", help="Only these labels (comma list).")] = None,
    cap_method: Annotated[str, typer.Option("--cap-method", help="auto, cgroup-v1, cgroup-v2, balloon.")] = "auto",
    out: Annotated[Path, typer.Option("--out", help="Output directory (cells.csv, clients.csv).")] = Path("bench-out"),
    cache_ab: Annotated[bool, typer.Option("--cache-ab", hidden=True,
                                           help="Each cell also with the LRU expert cache (label -lru).")] = False,
    host: Annotated[str | None, typer.Option("--host", help=BOARD_HELP)] = None,
    install_dir: InstallDirOpt = None,
    ssh_config: SshConfigOpt = None,
    accept_new_host_key: AcceptNewOpt = False,
    *,
    context: typer.Context,
) -> None:
    """Concurrent streaming clients against a real `serve --parallel` under a RAM cap: tok/s, TTFT, union bytes.
    Each cell's line as it ends on stderr, the findings table (summary.md) on stdout.

    With --host, the campaign runs on the board through its current release (-m: paths there; its profile; only
    the options given here are passed on), detached: its progress streams here and its files come back into
    --out; a lost connection leaves it running, and the same command with the same --out follows it."""
    from bmoe_edge.bench import serve_bench
    from bmoe_edge.boards import profiles

    try:
        counts = [int(x) for x in clients.split(",") if x.strip()]
    except ValueError:
        fail(f"--clients {clients!r}: a comma list of client counts")
    if not counts or min(counts) < 1:
        fail(f"--clients {clients!r}: at least one client")
    if host:
        run = _on_board(context, host, ["serve"], [str(m) for m in model], out, install_dir, ssh_config,
                        accept_new_host_key)
        if run.exited == 0:
            typer.echo((out / "summary.md").read_text(), nl=False)
        raise typer.Exit(run.exited)
    matrix = serve_bench.default_cells(counts, long_prompt, chunk)
    if cache_ab:
        matrix = serve_bench.with_ab(matrix, *serve_bench.CACHE_AB)
    matrix = _only_cells(matrix, cells)
    models = {m.stem: m for m in model}
    # Each server is a Python of its own: on an emulated board (a release under qemu-user) through its exec wrapper.
    python = [*profiles.exec_prefix_here(), sys.executable]
    serve_bench.campaign(models, out, matrix, cap=ram_cap, cap_method=cap_method, tokens=tokens, repeats=repeats,
                         threads=threads, ctx=ctx, python=python, say=lambda line: typer.echo(line, err=True))
    typer.echo((out / "summary.md").read_text(), nl=False)


@bench_app.command("cache-sim")
def bench_cache_sim_cmd(
    trace: Annotated[list[Path], typer.Argument(help="Route traces (CSV) with their .json sidecars.")],
    budget: Annotated[str, typer.Option("--budget-mib", help="Cache budgets to replay at, MiB (comma list).")] = "537",
    out: Annotated[Path, typer.Option("--out", help="Output directory (cache-sim.csv, cache-sim.md).")] = Path("."),
) -> None:
    """Replay route traces against expert-cache policies offline: hit rate and bytes read per token."""
    from bmoe_edge.bench import cache_sim

    try:
        budgets = [float(x) for x in budget.split(",") if x.strip()]
    except ValueError:
        fail(f"--budget-mib {budget!r}: a comma list of MiB")
    for path in trace:
        if not path.is_file() or not path.with_suffix(".json").is_file():
            fail(f"{path}: a route trace and its .json sidecar (expert_bytes, n_expert) are needed")
    rows = cache_sim.run(trace, budgets, out)
    typer.echo(cache_sim.table(rows), nl=False)


@bench_app.command("summary")
def bench_summary_cmd(out: Annotated[Path, typer.Argument(help="A bench stream output directory.")]) -> None:
    """Rewrite summary.md, targets.json and the plots of a finished campaign."""
    from bmoe_edge.bench import results

    typer.echo(results.write_summary(out).read_text(), nl=False)


@bench_app.command("report")
def bench_report_cmd(
    paths: Annotated[list[Path], typer.Argument(help="A bench stream output directory (its card is written there), "
                                                     "or several directories and card.json files to compare.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the card(s) as JSON.")] = False,
) -> None:
    """One shareable card of a campaign: machine, storage, model, and per cell tok/s, MB read per token, hit rate
    and TTFT; nothing that identifies the machine or its user. Several make one comparison table."""
    import json

    from bmoe_edge.bench import report

    cards = [report.load_card(p) for p in paths]
    if len(paths) == 1 and paths[0].is_dir():
        report.write_card(paths[0])
    if as_json:
        typer.echo(json.dumps(cards[0] if len(cards) == 1 else cards, indent=2))
    elif len(cards) == 1:
        typer.echo(report.card_markdown(cards[0]), nl=False)
    else:
        typer.echo(report.compare_markdown(cards), nl=False)


@bench_app.command("routing")
def bench_routing_cmd(
    model: Annotated[Path, typer.Option("-m", "--model")],
    tokens: Annotated[int, typer.Option("--tokens", min=2)] = 64,
    out: Annotated[Path, typer.Option("--out")] = Path("bench-out"),
) -> None:
    """Which experts the router chooses, per token and layer (the engine's route trace): popularity, reuse."""
    from bmoe_edge.bench import routing

    stats = routing.routing_report(model, tokens, out)
    typer.echo(json.dumps({k: v for k, v in stats.items() if k != "mean_ranked_freq"}, indent=2))


@bench_app.command("kernels")
def bench_kernels_cmd(
    model: Annotated[list[Path], typer.Option("-m", "--model", help="A gguf (repeat for several).")],
    threads: Annotated[str, typer.Option("--thread-counts", help="Compute threads of each run (comma list).")] = "1,2",
    repack: Annotated[str, typer.Option("--repack-settings", help="The engine's --repack values to measure (comma "
                                        "list).")] = "auto,off",
    repeats: Annotated[int, typer.Option("--repeats", min=1)] = 3,
    tokens: Annotated[int, typer.Option("--tokens", min=2, help="Decoded tokens per run.")] = 32,
    decode_runs: Annotated[int, typer.Option("--decode-runs", min=1, help="Decode runs per side in each repeat "
                                             "(their median).")] = 5,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", min=0, help="The cached prompt's length (0: decode "
                                               "only).")] = 512,
    flash_attn: Annotated[str, typer.Option("--flash-attn-settings", help="Flash attention settings to measure, each "
                                            "on both sides (comma list of off, on, auto).")] = "off,auto",
    out: Annotated[Path, typer.Option("--out")] = Path("bench-out/kernels"),
) -> None:
    """The engine's kernels against stock llama.cpp's: streamed with the cache warm, uncapped, beside the pin's
    llama-bench (its defaults: resident, repacked; flash attention set as the engine's), decode and a cached
    prompt, paired per repeat."""
    from bmoe_edge.bench import kernels
    from bmoe_edge.boards import profiles
    from bmoe_edge.engine import settings

    base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
    try:
        counts = [int(x) for x in threads.split(",") if x.strip()]
    except ValueError:
        fail(f"--thread-counts {threads!r}: a comma list of thread counts")
    settings_fa = [f.strip() for f in flash_attn.split(",") if f.strip()]
    if not settings_fa or any(f not in kernels.FLASH_ATTN_SETTINGS for f in settings_fa):
        fail(f"--flash-attn-settings {flash_attn!r}: a comma list of {', '.join(kernels.FLASH_ATTN_SETTINGS)}")
    rows = kernels.run(model, base, counts, [r.strip() for r in repack.split(",") if r.strip()],
                       repeats=repeats, decode_tokens=tokens, prompt_tokens=prompt_tokens, decode_runs=decode_runs,
                       flash_attns=settings_fa, say=typer.echo, wrapper=profiles.exec_prefix_here())
    kernels.write(rows, out)
    typer.echo(kernels.summary(rows), nl=False)


@bench_app.command("quality")
@setting_options([BY_NAME["cache_mb"]], "engine")  # --cache-mb, as `generate` takes it (default: the profile's)
def bench_quality_cmd(
    model: Annotated[Path, typer.Option("-m", "--model")],
    lossy: Annotated[list[str], typer.Option("--lossy", help="A lossy setting to compare with the lossless model, "
                                             "e.g. n_expert_used=6 or drop_cold=0.05 (repeat for several).")],
    tokens: Annotated[int, typer.Option("--tokens", min=2, help="Greedy tokens generated per setting.")] = 64,
    prompt: Annotated[str | None, typer.Option("--prompt", help="The generation prompt.")] = None,
    text: Annotated[Path | None, typer.Option("--text", help="Score this text's perplexity (default: a built-in "
                                              "paragraph).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write quality.json and quality.md here.")] = None,
    *, engine: dict[str, object],
) -> None:
    """What lossy knobs cost: token agreement with the lossless run and the perplexity delta on a text,
    every run with this machine's settings."""
    from bmoe_edge.bench import quality
    from bmoe_edge.boards import profiles
    from bmoe_edge.engine import settings

    base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, engine)
    try:
        body = text.read_text() if text is not None else quality.DEFAULT_TEXT
    except OSError as exc:
        fail(f"cannot read the text to score: {exc}")
    rows = quality.bench_quality(model, base, [quality.parse_lossy(spec) for spec in lossy], tokens=tokens,
                                 prompt=prompt or quality.DEFAULT_PROMPT, text=body)
    if out is not None:
        quality.write_quality(rows, out)
    typer.echo(quality.quality_table(rows), nl=False)


@bench_app.command("cell", hidden=True)
def bench_cell_cmd(spec: Annotated[str, typer.Argument(help="The cell as JSON.")]) -> None:
    """One benchmark cell in this process (spawned by `bench stream`); prints one JSON record."""
    from bmoe_edge.bench import cells

    raise typer.Exit(cells.cell_main(spec))


@bench_app.command("rpc")
def bench_rpc_cmd(
    model: Annotated[Path, typer.Option("-m", "--model", help="The gguf (bigger than any one participant's cap).")],
    ram_cap: Annotated[str, typer.Option("--ram-cap", help="Every process's cap: PCT% of the model file, or MiB.")],
    workers: Annotated[str, typer.Option("--workers", help="Worker counts (0 = streaming alone).")] = "0,1,2",
    tokens: Annotated[int, typer.Option("--tokens", min=2, help="Generated tokens per cell.")] = 64,
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("bench-out/rpc"),
    threads: Annotated[int, typer.Option(*THREADS.row.flags, help=THREADS.help)] = THREADS.value,
    cap_method: Annotated[str, typer.Option("--cap-method", help="auto, cgroup-v1, cgroup-v2.")] = "auto",
) -> None:
    """Main + N rpc-server workers, each process in its own cgroup at the same cap, against streaming
    alone: tok/s and bytes over the network per token (records in OUT/rpc.jsonl; docs/rpc.md)."""
    from bmoe_edge.bench import ramcap, rpc_cells
    from bmoe_edge.bench.cells import BenchCell

    try:
        counts = [int(n) for n in workers.split(",")]
    except ValueError:
        fail(f"--workers must be counts separated by commas, got {workers!r}")
    cap = ramcap.parse_cap(ram_cap, model.stat().st_size)
    cell = BenchCell("stream", "stream", config={**_machine_defaults(tokens), "threads": threads}, tokens=tokens)
    records = rpc_cells.run_rpc_cells(cell, model, cap, counts, out, cap_method=cap_method, threads=threads)
    with (out / "rpc.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    for r in records:
        typer.echo(f"{r['label']:<14} workers {r['workers']}  {r.get('status')}  {r.get('tok_s', 0):.2f} tok/s  "
                   f"net {r.get('net_bytes_per_token', 0) / 1024:.1f} KiB/token  "
                   f"main peak {r.get('cap_max_usage_mb', 0)} MiB  workers' peaks {r['worker_cap_peaks_mb']} MiB")
