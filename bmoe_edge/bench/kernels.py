"""`bench kernels`: the compute side against the real anchor. With the experts in memory (uncapped, a fixed
cache of every expert, warm), the engine's streamed decode and its prompt are set by llama.cpp's kernels, not
by the drive; stock llama.cpp (the pin's own `llama-bench`, its defaults: resident, repacked kernels) is what
a user compares us with. Both sides compute the same attention: each flash-attention setting measured runs the
engine and llama-bench with it (`off`, the engine's default, against `llama-bench -fa 0`; `auto`, llama-bench's
default, on both), in a context of the same size (llama-bench's test sizes its own: `llama_bench.context_cells`),
with its tokens at the engine's positions. A token costs more the more cells precede it (flash attention's CPU
kernel skips the masked ones; without it too: llama-bench's 1-token decode at two threads took 2.2 ms more after
200 cells with it, 1.4 ms without, bench-data/2026-12-06/host-not-compaction), and llama-bench's 1-token decodes at
position 0 measured ~2-3.5% less work than the engine's steps after its prompt. So llama-bench's tg runs after the
engine's prompt length (`-d`), its 1-token decodes spread over the positions of the engine's measured steps
(`token_depths`).

Per model, thread count, flash-attention setting and `--repack` setting, two phases, each with its own engine
opened in its test's context and warmed once: decode (`decode_tokens` tokens after a short prompt, the prompt step
left out, against llama-bench's tg), then the prompt (a `prompt_tokens` prompt the engine has not seen, no prefix
reuse, every routed expert cached, against its pp). In each, every repeat measures the engine and llama-bench back
to back (alternating which goes first): the ratio of the two is taken within a repeat, seconds apart, as the
shared machine's speed drifts. A repeat's decode on each side is the median of `decode_runs` runs (the engine's
runs one after another, llama-bench's repetitions of one process): a single run of a second or two is at the
mercy of one hiccup of the shared machine, which at two threads on two cores moved one run by up to 25%
(bench-data/2026-12-05/kernels-context).

Per token besides: the host's stalls land on a few tokens of a run, so a run's mean carries them where a low
quantile of its tokens does not. Each repeat also compares the 10th percentile of the engine's per-step decode
times (every run's, its first decode after the prompt step left out) with that of llama-bench's `-n 1 -r
TOKEN_SAMPLES` (each repetition one 1-token decode in the same cells, at the engine's positions): `token_ratio`
(bench-data/2026-12-05/two-threads-streamed).
"""

from __future__ import annotations

import csv
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bmoe_edge.bench import llama_bench
from bmoe_edge.bench.machine import LONG_TEXT, PROMPT
from bmoe_edge.engine import settings
from bmoe_edge.errors import BmoeError

# llama-bench's -fa values are the spellings of the engine's flash_attn toggle.
FLASH_ATTN_SETTINGS: tuple[str, ...] = settings.BY_NAME["flash_attn"].native_choices
PROMPT_ROOM = 16  # the decode's short prompt (PROMPT) in tokens, at most
TOKEN_SAMPLES = 150  # llama-bench's 1-token decodes per repeat, for the per-token comparison
TOKEN_QUANTILE = 0.10
TOKEN_DEPTHS = 8  # the positions llama-bench's 1-token decodes are spread over (token_depths)
WARMUP_TOKENS = 96  # a uniform router's 8 of 64 experts a token: every expert of every layer routed (p > 1 - 1e-5)


@dataclass
class KernelRow:
    model: str
    threads: int
    repack: str
    repeat: int
    decode_tok_s: float  # the median of decode_runs runs (llama-bench's: of as many repetitions)
    prompt_tok_s: float
    prompt_reused: int  # tokens the prompt measured reused (0: none)
    llama_bench_decode_tok_s: float  # llama.cpp's defaults but -fa, set as the engine's flash attention
    llama_bench_prompt_tok_s: float
    hit_pct: float  # the measured prompt's lookups that hit
    flash_attn_setting: str  # both sides' (off, auto)
    flash_attn: bool  # the engine's, as llama.cpp resolved it
    repack_layouts: str
    first: str  # which ran first in this repeat: "engine" or "llama-bench"
    decode_ctx: int  # the engines' contexts (cells): llama-bench's test's, room for the short prompt besides
    prompt_ctx: int
    decode_runs: str  # each run's decode tok/s, space separated (decode_tok_s is their median)
    llama_bench_decode_runs: str  # each of llama-bench's repetitions
    decode_token_ms: float  # TOKEN_QUANTILE of the engine's per-step decode times over the repeat's runs
    llama_bench_token_ms: float  # the same of llama-bench's TOKEN_SAMPLES 1-token decodes

    @property
    def decode_ratio(self) -> float:
        return _ratio(self.decode_tok_s, self.llama_bench_decode_tok_s)

    @property
    def token_ratio(self) -> float:
        """Per token, as a speed: llama-bench's time over the engine's (0 where either measured nothing)."""
        return _ratio(self.llama_bench_token_ms, self.decode_token_ms)

    @property
    def prompt_ratio(self) -> float:
        return _ratio(self.prompt_tok_s, self.llama_bench_prompt_tok_s)


def _ratio(engine: float, anchor: float) -> float:
    """The engine's tok/s over llama-bench's (0 where llama-bench measured nothing)."""
    return engine / anchor if anchor else 0.0


def _prompt_ids(tokenize: Callable[[str], list[int]], n_tokens: int, variant: int) -> list[int]:
    """`n_tokens` ids of text the engine has not decoded before: LONG_TEXT from a different word each time."""
    words = LONG_TEXT.split()
    shift = (variant * 7) % len(words)
    text = " ".join(words[shift:] + words[:shift])
    ids = tokenize(text)
    while len(ids) < n_tokens:
        text += " " + text
        ids = tokenize(text)
    return ids[:n_tokens]


def full_cache_mb(model: Path) -> float:
    """A fixed expert cache (`cache_mb`) that holds every expert of `model`, with a little room to spare."""
    from bmoe_edge.engine import info

    return float(math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1))


def token_depths(prompt_len: int, decode_tokens: int, n: int = TOKEN_DEPTHS) -> list[int]:
    """Where llama-bench's 1-token decodes start: `n` depths spread evenly over the positions of the engine's
    measured steps (every step of a run but its first two: prompt_len + 1 .. prompt_len + decode_tokens - 1), so
    both sides' tokens attend as many cells (flash attention's cost grows with them)."""
    first, last = prompt_len + 1, prompt_len + max(1, decode_tokens - 1)
    if n <= 1 or last == first:
        return [first]
    return sorted({first + round(i * (last - first) / (n - 1)) for i in range(n)})


def quantile(values: Sequence[float], q: float) -> float:
    """The value at fraction `q` of the sorted values (nearest rank below; 0 for none)."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else 0.0


def _measure_decode(engine: Any, decode_tokens: int, runs: int) -> tuple[list[float], list[float]]:
    """The decode tok/s of `runs` runs, and every decode step's time but each run's first (the switch from the
    prompt step's threads and graph)."""
    from bmoe_edge.engine import report

    tok_s: list[float] = []
    step_ms: list[float] = []
    for _ in range(runs):
        gen = engine.run(PROMPT, decode_tokens + 1)
        tok_s.append(float(report.summary(gen, engine.run_info)["decode_tok_s"]))
        step_ms += [m.wall_ms for m in gen.metrics[2:]]
    return tok_s, step_ms


def _measure_prompt(engine: Any, prompt_tokens: int, variant: int) -> tuple[float, int, float]:
    """Prompt tok/s, the tokens it reused (0: a prompt not seen before) and the share of its lookups that hit."""
    from bmoe_edge.engine import report

    prompt = report.summary(engine.run(_prompt_ids(engine.tokenize, prompt_tokens, variant), 1), engine.run_info)
    return (float(prompt["prompt_tok_s"]), int(prompt.get("prompt_reused_tokens", 0)),
            float(prompt["cache_hit_pct"]))


def _pairs(repeats: int, measure_engine: Callable[[int], Any],
           measure_anchor: Callable[[], Any]) -> list[tuple[Any, Any, str]]:
    """Per repeat: the engine's measurement, llama-bench's and which went first (alternating)."""
    out = []
    for r in range(repeats):
        engine_first = r % 2 == 0
        if engine_first:
            mine = measure_engine(r)
            anchor = measure_anchor()
        else:
            anchor = measure_anchor()
            mine = measure_engine(r)
        out.append((mine, anchor, "engine" if engine_first else "llama-bench"))
    return out


def run(models: Sequence[Path], base: Any, threads: Sequence[int], repacks: Sequence[str], *, repeats: int,
        decode_tokens: int, prompt_tokens: int, decode_runs: int = 5, flash_attns: Sequence[str] = ("off", "auto"),
        say: Callable[[str], None] = print, wrapper: Sequence[str] = ()) -> list[KernelRow]:
    """`base`: the StreamConfig every engine starts from (the machine's defaults); threads, flash attention (both
    sides), --repack and the context vary. `wrapper`: how this machine starts its own programs (llama-bench)."""
    llama_bench.binary(say)  # the anchor built (once) or refused before any engine loads
    rows: list[KernelRow] = []
    for model in models:
        # A fixed cache of every expert: the kernels measured, not the adaptive budget's answer to llama-bench
        # loading the same model beside it.
        full_mb = full_cache_mb(model)
        for t, fa, repack in ((t, fa, repack) for t in threads for fa in flash_attns for repack in repacks):
            config = replace(base, threads=t, repack=repack, cache_mb=full_mb,
                             flash_attn=settings.BY_NAME["flash_attn"].from_native(fa))
            for row in _measure_setting(model, config, fa, repeats, decode_tokens, decode_runs, prompt_tokens,
                                        wrapper):
                rows.append(row)
                say(f"{model.name} t={t} fa={fa} repack={repack} #{row.repeat}: decode {row.decode_tok_s:.2f} vs "
                    f"{row.llama_bench_decode_tok_s:.2f} tok/s ({row.decode_ratio:.3f}x; per token p10 "
                    f"{row.decode_token_ms:.2f} vs {row.llama_bench_token_ms:.2f} ms, {row.token_ratio:.3f}x)"
                    + (f", prompt {row.prompt_tok_s:.1f} vs {row.llama_bench_prompt_tok_s:.1f} "
                       f"({row.prompt_ratio:.3f}x)" if prompt_tokens else ""))
    return rows


def _measure_setting(model: Path, config: Any, fa: str, repeats: int, decode_tokens: int, decode_runs: int,
                     prompt_tokens: int, wrapper: Sequence[str] = ()) -> list[KernelRow]:
    """The two phases of one setting: an engine each, in the context of llama-bench's test it is paired with."""
    from bmoe_edge.engine import Engine

    def anchor(decode: int, prompt: int, repetitions: int = 1, depths: Sequence[int] = (0,)) -> dict[str, Any]:
        return llama_bench.run(model, threads=config.threads, decode_tokens=decode, prompt_tokens=prompt,
                               flash_attn=fa, repetitions=repetitions, depths=depths, wrapper=wrapper)

    # The decode's engine holds the short prompt besides: llama-bench's tokens sit at the same positions (-d).
    decode_ctx = llama_bench.context_cells(0, decode_tokens + PROMPT_ROOM)
    prompt_len = 0

    def anchor_decode() -> tuple[list[float], list[float]]:
        """llama-bench's tg runs (tok/s) after the engine's prompt, and its 1-token decodes' times (ms) at the
        positions of the engine's measured steps: those only where they run in the engine's context (a longer
        context's decode computes more cells)."""
        runs = anchor(decode_tokens, 0, decode_runs, (prompt_len,))["decode_samples"]
        depths = token_depths(prompt_len, decode_tokens)
        if decode_ctx != llama_bench.context_cells(0, 1, max(depths)):
            return runs, []
        samples = anchor(1, 0, -(-TOKEN_SAMPLES // len(depths)), depths)["decode_samples"]
        return runs, [1000.0 / x for x in samples if x > 0]

    with Engine(model, replace(config, ctx=decode_ctx)) as engine:
        # every expert cached, the pool's pages in place; the prompt's length places llama-bench's tokens
        prompt_len = len(engine.run(PROMPT, WARMUP_TOKENS).prompt_tokens)
        if prompt_len > PROMPT_ROOM:
            raise BmoeError(f"bench kernels: the decode's prompt is {prompt_len} tokens, more than the {PROMPT_ROOM} "
                            "its context leaves room for")
        layouts, resolved_fa = str(engine.run_info["repack_layouts"]), bool(engine.run_info["flash_attn"])
        decodes = _pairs(repeats, lambda r: _measure_decode(engine, decode_tokens, decode_runs), anchor_decode)
    prompt_ctx = llama_bench.context_cells(prompt_tokens, 0)
    prompts: list[tuple[Any, Any, str]] = [((0.0, 0, 0.0), 0.0, "")] * repeats   # --prompt-tokens 0: decode only
    if prompt_tokens > 0:
        with Engine(model, replace(config, ctx=prompt_ctx)) as engine:
            engine.run(PROMPT, WARMUP_TOKENS)
            engine.run(_prompt_ids(engine.tokenize, prompt_tokens, -1), 1)
            prompts = _pairs(repeats, lambda r: _measure_prompt(engine, prompt_tokens, r),
                             lambda: anchor(0, prompt_tokens)["prompt_tok_s"])
    return [KernelRow(model.name, config.threads, config.repack, r, decode_tok_s=statistics.median(decode),
                      prompt_tok_s=prompt, prompt_reused=reused, llama_bench_decode_tok_s=statistics.median(lb_decode),
                      decode_token_ms=quantile(steps, TOKEN_QUANTILE),
                      llama_bench_token_ms=quantile(lb_steps, TOKEN_QUANTILE),
                      llama_bench_prompt_tok_s=lb_prompt, hit_pct=hit, flash_attn_setting=fa, flash_attn=resolved_fa,
                      repack_layouts=layouts, first=first, decode_ctx=decode_ctx, prompt_ctx=prompt_ctx,
                      decode_runs=" ".join(f"{x:.2f}" for x in decode),
                      llama_bench_decode_runs=" ".join(f"{x:.2f}" for x in lb_decode))
            for r, (((decode, steps), (lb_decode, lb_steps), first), ((prompt, reused, hit), lb_prompt, _))
            in enumerate(zip(decodes, prompts, strict=True))]


def write(rows: Sequence[KernelRow], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "kernels.csv", "w", newline="") as f:
        ratios = ("decode_ratio", "token_ratio", "prompt_ratio")
        w = csv.DictWriter(f, fieldnames=[*asdict(rows[0]).keys(), *ratios])
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r) | {k: round(getattr(r, k), 4) for k in ratios})
    (out / "summary.md").write_text(summary(rows))


def _best(runs: Sequence[str]) -> float:
    """The fastest of every run of a group (space-separated tok/s per row)."""
    return max((float(x) for text in runs for x in text.split()), default=0.0)


def _per_token(group: Sequence[KernelRow]) -> str:
    """The group's per-token cell: the median p10 of each side and the median of the per-repeat ratios."""
    measured = [r for r in group if r.token_ratio > 0]
    if not measured:
        return "-"
    return (f"{statistics.median(r.decode_token_ms for r in measured):.2f} / "
            f"{statistics.median(r.llama_bench_token_ms for r in measured):.2f}: "
            f"{statistics.median(r.token_ratio for r in measured):.3f}")


def _prompt_cells(group: Sequence[KernelRow]) -> str:
    """The group's three prompt cells (engine, llama-bench, ratio): dashes where no prompt was measured
    (`--prompt-tokens 0`), not a speed of 0."""
    if not any(r.prompt_tok_s > 0 for r in group):
        return "- | - | -"
    return (f"{statistics.median(r.prompt_tok_s for r in group):.1f} | "
            f"{statistics.median(r.llama_bench_prompt_tok_s for r in group):.1f} | "
            f"{statistics.median(r.prompt_ratio for r in group):.3f}")


def summary(rows: Sequence[KernelRow]) -> str:
    """Medians per model, threads and --repack: the engine's tok/s, llama-bench's, and the paired ratios; and
    the fastest run of each side."""
    lines = [f"# bench kernels ({time.strftime('%Y-%m-%d')})", "",
             "Streamed with the cache warm (uncapped), the engine's defaults but --threads, --repack, flash attention "
             "and the context, against the pin's llama-bench (resident, its defaults: repacked kernels) with the same "
             "flash attention setting (`-fa`; `off` is the engine's default, `auto` llama-bench's) in a context of "
             "the same size (cells: decode's, prompt's). Ratios are medians of per-repeat ratios (engine / "
             "llama-bench, measured back to back; a repeat's decode on each side: the median of its runs). "
             "Best: the fastest decode run of each side over all repeats, and their ratio (the shared machine only "
             "ever slows a run down: the fastest is the nearest to the kernels' own speed). Per token: the 10th "
             "percentile of each side's 1-token decode times in a repeat (the engine's steps, llama-bench's "
             f"`-n 1` ~{TOKEN_SAMPLES} times at {TOKEN_DEPTHS} depths over the engine's positions; its tg after the "
             "engine's prompt: flash attention's cost grows with the cells before a token), engine / llama-bench "
             "as a speed, the median over repeats (a host's "
             "stalls land on a few tokens: out of the low quantile).", "",
             "| model | threads | --repack | layouts | flash attention (resolved) | cells | decode tok/s | "
             "llama-bench tg | decode ratio | best: engine / llama-bench | per token p10 ms: engine / llama-bench | "
             "prompt tok/s | llama-bench pp | prompt ratio | repeats |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r.model, r.threads, r.flash_attn_setting, r.repack) for r in rows})
    for model, t, fa, repack in keys:
        group = [r for r in rows if (r.model, r.threads, r.flash_attn_setting, r.repack) == (model, t, fa, repack)]

        def med(values: list[float]) -> float:
            return statistics.median(values) if values else 0.0
        best = _best([r.decode_runs for r in group])
        best_anchor = _best([r.llama_bench_decode_runs for r in group])
        lines.append(
            f"| {model} | {t} | {repack} | {group[0].repack_layouts or '-'} | "
            f"{fa} ({'on' if group[0].flash_attn else 'off'}) | {group[0].decode_ctx}, {group[0].prompt_ctx} | "
            f"{med([r.decode_tok_s for r in group]):.2f} | {med([r.llama_bench_decode_tok_s for r in group]):.2f} | "
            f"{med([r.decode_ratio for r in group]):.3f} | "
            f"{best:.2f} / {best_anchor:.2f}: {_ratio(best, best_anchor):.3f} | "
            f"{_per_token(group)} | "
            f"{_prompt_cells(group)} | {len(group)} |")
    return "\n".join(lines) + "\n"
