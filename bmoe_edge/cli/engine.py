"""Commands of the run stage: --version, doctor, info, archs, tiny-model, generate."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from bmoe_edge import __version__, doctor, llama_source
from bmoe_edge.cli.common import (
    Where,
    app,
    engine_options,
    fail,
    machine_config,
    sampling_options,
    where_options,
)
from bmoe_edge.engine import checksums, info, moe_archs, runner, settings
from bmoe_edge.errors import BmoeError, show_path
from bmoe_edge.proof.gates import gated_architectures
from bmoe_edge.synthetic import tinymoe


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
    # which build this is: a board bundle run under qemu says aarch64
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


@app.command("verify-model")
def verify_model_cmd(
    model: Annotated[Path, typer.Argument(help="A gguf model file (the first shard of a split model).")],
    rewrite: Annotated[bool, typer.Option("--rewrite", help="Compute the sums again and replace the sidecar.")] = False,
) -> None:
    """Check every byte of a model against its checksum sidecar (<model>.sums): the headers, every dense
    tensor and every expert slice (CRC-32C). A model without a sidecar gets one, for `--verify-slices`."""
    report = checksums.verify_model(model, rewrite)
    if report.written:
        typer.echo(f"wrote {show_path(report.sidecar)}: {report.slices} checksums (CRC-32C) of "
                   f"{len(report.files)} file(s)")
        return
    for m in report.mismatches[:20]:
        typer.echo(f"MISMATCH {m.describe(report.files)}")
    if report.mismatches:
        fail(f"{len(report.mismatches)} of {report.slices} ranges of {show_path(model)} differ from "
             f"{show_path(report.sidecar)}: the model is damaged on this storage; copy or fetch it again")
    typer.echo(f"ok: all {report.slices} checksums of {show_path(model)} match {show_path(report.sidecar)}")


@app.command("tiny-model")
def tiny_model_cmd(
    arch: Annotated[str | None, typer.Option("--arch", help=f"One of: {', '.join(tinymoe.ARCHS)}; or a refused one "
                                             f"(to measure it): {', '.join(tinymoe.REFUSED_ROWS)}.")] = None,
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
        from bmoe_edge.synthetic import bigmoe

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
def archs_cmd(as_json: Annotated[bool, typer.Option("--json", help="One record per architecture.")] = False) -> None:
    """Every MoE architecture of the pinned llama.cpp (its graph calls build_moe_ffn) and its status.

    "gated": a tiny fixture of it passes streamed == resident, ids and logits (`gates`); "refused": its
    experts cannot be streamed, and why (generate says so before loading weights); "untested": the
    default discovery applies (experts are the weights the graph multiplies with MUL_MAT_ID) but no
    gate has proven it yet.
    """
    rows = moe_archs.statuses(gated_architectures(), info.recipes())
    counts = {s: sum(r.status == s for r in rows) for s in ("gated", "refused", "untested")}
    if as_json:
        typer.echo(json.dumps({"llama_pin": info.version_info().llama_pin, "counts": counts,
                               "architectures": [asdict(r) for r in rows]}, indent=2))
        return
    for r in rows:
        detail = r.reason or (f"fixture {r.fixture}" if r.fixture else "")
        if r.draft_model:
            detail += f"{'; ' if detail else ''}draft model {r.draft_model} (--draft-model)"
        typer.echo(f"{r.architecture:<16} {r.status:<9} {r.source:<32} {detail}")
    typer.echo(f"archs: {len(rows)} MoE architectures: {counts['gated']} gated, {counts['refused']} refused, "
               f"{counts['untested']} untested")


def _unproven(architecture: str) -> str:
    return moe_archs.unproven_note(architecture, gated_architectures(), info.recipes())


@app.command("generate")
@engine_options()
@sampling_options()
@where_options()
def generate_cmd(
    model: Annotated[Path, typer.Option("-m", "--model", help="The gguf model (first shard of a split model).")],
    prompt: Annotated[str | None, typer.Option("-p", "--prompt", help="The prompt text.")] = None,
    prompt_file: Annotated[Path | None, typer.Option("--prompt-file", help="Read the prompt from this file "
                                                     "(verbatim, any length).")] = None,
    max_tokens: Annotated[int, typer.Option("-n", "--max-tokens", min=1)] = 64,
    board: Annotated[str | None, typer.Option("--board", help="Take the defaults from this board profile "
                                              "(default: this machine's: the deployed board's, else host).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    progress: Annotated[bool, typer.Option("--progress", help="Per-token telemetry on stderr.")] = False,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Write per-token telemetry here.")] = None,
    *,
    engine: dict[str, Any],
    sampling: dict[str, Any],
    where: Where,
) -> None:
    """Generate text headlessly, streaming the routed experts from flash (greedy by default).

    The prompt is text (control-token names stay text unless --parse-special). Any failure (a read
    error, --io-timeout, a --verify-slices mismatch, the model changing on disk) stops the run with
    one line and exit code 1.

    With --host, it runs on the board through its current release (-m is a path on the board, the
    deployed board profile gives the defaults) and the tokens stream back as they come."""
    if (prompt is None) == (prompt_file is None):
        fail("give the prompt with -p TEXT or --prompt-file FILE (one of them)")
    if prompt is None:
        try:
            prompt = Path(prompt_file).read_text(encoding="utf-8")  # type: ignore[arg-type]
        except OSError as exc:
            fail(f"cannot read the prompt file {prompt_file}: {exc.strerror}")
        except UnicodeDecodeError:
            fail(f"the prompt file {prompt_file} is not UTF-8 text")
    text = prompt
    where.on_board(lambda onboard, target, options: onboard.board_generate(
                 target, str(model), text, onboard.generate_args(
                     max_tokens=max_tokens, as_json=as_json, progress=progress,
                     csv_path=None if csv_path is None else str(csv_path), overrides={**engine, **sampling}),
                 options=options, board_name=board, install_dir=where.install_dir))
    outputs = runner.Outputs(as_json=as_json, progress=progress, csv_path=csv_path)
    say = (lambda m: typer.echo(m, err=True)) if progress else None
    with where.rpc_tunnelled(engine, say) as flags:
        runner.generate(model, prompt, max_tokens, machine_config(board, flags, (prompt, max_tokens)),
                        settings.sampling(sampling),
                        outputs, arch_warning=_unproven)
