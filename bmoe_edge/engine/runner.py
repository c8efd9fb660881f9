"""Headless generation: run a resolved configuration, stream the tokens and telemetry out.

The configuration comes from bmoe_edge.engine.settings.resolve (defaults, a board profile's `engine:`
section, then the flags that were given).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from bmoe_edge.engine import report
from bmoe_edge.engine.generation import Generation, Sampling
from bmoe_edge.engine.session import Engine
from bmoe_edge.engine.settings import StreamConfig


def _align_up(n: int, to: int) -> int:
    return -(-n // to) * to


def fit_to_job(config: StreamConfig, prompt: str | int, max_tokens: int, fixed: Collection[str] = ()) -> StreamConfig:
    """`generate` is one job of a known size: a context and a batch no larger than it can use leave
    their memory to the expert cache. The KV cache is written in full when the context is made and the
    compute buffers are sized for the batch; on the 3 GB preset under a 1142 MiB cap the table's
    ctx 2048 and batch 512 took ~150 MiB that a 64-token answer never uses. A token spans at least one
    byte of the prompt, so the prompt's bytes (plus the special tokens added around it) bound its
    tokens; speculative drafts need room for one verification batch. Settings given on the command
    line or by the board profile (`fixed`) are kept (not --parallel: one job is one sequence), and nothing grows
    past the table's value. `prompt`: its text, or its token count where that is known (a benchmark's prompt of
    N tokens).

    A long prompt is decoded in one ubatch up to the table's context (2048 tokens), not the table's 512: each
    ubatch of a long prompt routes to nearly every expert of every layer, so four ubatches of a 2,048-token
    prompt read its experts 3.4 times over (bench-data/2026-12-02/long-prompt). The compute buffers
    that ubatch writes are the cache's except while the prompt is decoded (docs/memory.md), and where the
    memory limit cannot hold them the engine decodes the prompt in the ubatch it can (its run info's
    `ubatch`)."""
    exact = isinstance(prompt, int)
    prompt_tokens = prompt if exact else len(prompt.encode("utf-8")) + 8
    drafts = config.draft_max + 1
    sized = {}
    if "ctx" not in fixed:
        # A known token count that needs more than the table's context gets it (the job asked for it); a
        # bound from bytes does not (it can be four times the tokens, and the KV cache is written whole).
        needed = _align_up(prompt_tokens + max_tokens + drafts, 256)
        sized["ctx"] = needed if exact else min(config.ctx, needed)
    # A prompt in one ubatch, up to the table's context; a given batch or ubatch is the most it may grow to.
    longest = max(config.batch, config.ctx) if not {"batch", "ubatch"} & set(fixed) else config.batch
    if "batch" not in fixed:  # never below a physical batch that was given (llama.cpp would clamp it)
        needed = max(64, _align_up(max(prompt_tokens, drafts), 64), config.ubatch if "ubatch" in fixed else 0)
        sized["batch"] = min(longest, needed)
    if "ubatch" not in fixed:
        sized["ubatch"] = sized.get("batch", config.batch) if "batch" not in fixed else min(config.ubatch, config.batch)
    # One job is one sequence: a profile's --parallel is a server's, and each slot more is a KV cache more.
    sized["parallel"] = 1
    return replace(config, **sized)


# The largest ubatch a conversation's prompt gets: a long system prompt and tools in one ubatch, whose attention
# scores (ubatch x context per head, without flash attention) stay within reach of a board's memory.
CONVERSATION_UBATCH = 2048


def fit_to_conversation(config: StreamConfig, fixed: Collection[str] = ()) -> StreamConfig:
    """`serve` and `chat` do not know their prompts ahead. A prompt longer than the table's 512-token ubatch was
    decoded in several, and each ubatch of a long prompt routes to nearly every expert of every layer: a
    1,000-token system prompt read its experts twice, a 2,000-token one four times (minutes at a board's
    0.43 GB/s). So the batch and ubatch are the context, up to CONVERSATION_UBATCH, as `generate` sizes them
    for a long prompt (fit_to_job): the buffers that ubatch writes are the cache's except while a prompt is
    decoded, and where the memory limit cannot hold them the engine decodes in the ubatch it can. A batch or
    ubatch a caller fixed is kept; with --parallel N the prompts go in chunks (prefill_chunk) beside the others'
    decodes, and the table's batch stays."""
    if {"batch", "ubatch"} & set(fixed) or config.parallel > 1:
        return config
    longest = max(config.batch, min(config.ctx, CONVERSATION_UBATCH))
    return replace(config, batch=longest, ubatch=longest)


@dataclass(frozen=True)
class Outputs:
    as_json: bool = False
    progress: bool = False
    csv_path: Path | None = None
    summary: bool = True


def generate(model: Path, prompt: str, max_tokens: int, config: StreamConfig, sampling: Sampling,
             outputs: Outputs, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr,
             arch_warning: Callable[[str], str] | None = None) -> Generation:
    """Print tokens as they come (text, or one JSON object per token), then a summary. `arch_warning`
    (architecture -> a warning or "") is said on stderr for a streamed run."""
    with Engine(model, config, prompt_cache_kind="file") as engine:
        info = engine.run_info
        warning = arch_warning(str(info["architecture"])) if arch_warning and info["streaming"] else ""
        if warning:
            print(f"warning: {warning}", file=err, flush=True)
        if outputs.as_json:
            print(report.json_line({"type": "run", **info}), file=out, flush=True)
        elif outputs.progress:
            print(report.run_header(info), file=err, flush=True)
        csv_out = report.MetricsCsv(outputs.csv_path, info) if outputs.csv_path else None
        result = Generation([])
        try:
            # With --prompt-cache FILE the context starts from the file's prompt where it fits this one.
            for token in engine.generate(prompt, max_tokens, sampling, result=result,
                                         reuse_kv=engine.prompt_cache is not None):
                if outputs.as_json:
                    print(report.json_line({"type": "token", "id": token.id, "text": token.text}), file=out,
                          flush=True)
                else:
                    print(token.text, end="", file=out, flush=True)
                if outputs.progress:
                    print(report.progress_line(token.metrics), file=err, flush=True)
                if csv_out:
                    csv_out.write(token.metrics)
        finally:
            if csv_out:
                csv_out.close()
        summary = report.summary(result, info)
        if outputs.as_json:
            print(report.json_line({"type": "summary", **summary}), file=out, flush=True)
        else:
            print(file=out, flush=True)
            if outputs.summary:
                print(report.summary_text(summary), file=err, flush=True)
        return result
