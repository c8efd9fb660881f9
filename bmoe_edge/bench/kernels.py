"""`bench kernels`: the compute side against the real anchor. With the experts in memory (uncapped, a fixed
cache of every expert, warm), the engine's streamed decode and its prompt are set by llama.cpp's kernels, not
by the drive; stock llama.cpp (the pin's own `llama-bench`, its defaults: resident, repacked kernels) is what
a user compares us with. Both sides compute the same attention: each flash-attention setting measured runs the
engine and llama-bench with it (`off`, the engine's default, against `llama-bench -fa 0`; `auto`, llama-bench's
default, on both). Per model, thread count and flash-attention setting, one engine per `--repack` setting is opened
and warmed once, then each repeat measures it and llama-bench back to back (alternating which goes first): the ratio of
the two is taken within a repeat, minutes apart at most, as the shared machine's speed drifts.

What one measurement is: `decode_tokens` tokens decoded after a short prompt (decode tok/s, the prompt step
left out), and a `prompt_tokens` prompt decoded with every routed expert cached (prompt tok/s: the prompt's
step), a prompt the engine has not seen (no prefix reuse) against llama-bench's tg and pp of the same sizes.
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

# A flash-attention setting as llama-bench's -fa takes it, and as the engine's settings row does.
ENGINE_FLASH_ATTN: dict[str, bool | str] = {"off": False, "on": True, "auto": "auto"}
WARMUP_TOKENS = 96  # a uniform router's 8 of 64 experts a token: every expert of every layer routed (p > 1 - 1e-5)


@dataclass
class KernelRow:
    model: str
    threads: int
    repack: str
    repeat: int
    decode_tok_s: float
    prompt_tok_s: float
    prompt_reused: int
    llama_bench_decode_tok_s: float  # llama.cpp's defaults but -fa, set as the engine's flash attention
    llama_bench_prompt_tok_s: float
    hit_pct: float
    flash_attn_setting: str  # both sides' (off, auto)
    flash_attn: bool  # the engine's, as llama.cpp resolved it
    repack_layouts: str
    first: str  # which ran first in this repeat: "engine" or "llama-bench"

    @property
    def decode_ratio(self) -> float:
        return _ratio(self.decode_tok_s, self.llama_bench_decode_tok_s)

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


def _measure_engine(engine: Any, decode_tokens: int, prompt_tokens: int, variant: int) -> dict[str, float]:
    from bmoe_edge.engine import report

    decode = report.summary(engine.run(PROMPT, decode_tokens + 1), engine.run_info)
    prompt = report.summary(engine.run(_prompt_ids(engine.tokenize, prompt_tokens, variant), 1), engine.run_info)
    return {"decode_tok_s": float(decode["decode_tok_s"]), "prompt_tok_s": float(prompt["prompt_tok_s"]),
            "prompt_reused": int(prompt.get("prompt_reused_tokens", 0)),
            "hit_pct": float(decode["cache_hit_pct"])}


def run(models: Sequence[Path], base: Any, threads: Sequence[int], repacks: Sequence[str], *, repeats: int,
        decode_tokens: int, prompt_tokens: int, flash_attns: Sequence[str] = ("off", "auto"),
        say: Callable[[str], None] = print) -> list[KernelRow]:
    """`base`: the StreamConfig every engine starts from (the machine's defaults); threads, flash attention (both
    sides) and --repack vary."""
    from bmoe_edge.engine import Engine, info

    rows: list[KernelRow] = []
    for model in models:
        for t, fa, repack in ((t, fa, repack) for t in threads for fa in flash_attns for repack in repacks):
            # A fixed cache of every expert: the kernels measured, not the adaptive budget's answer to
            # llama-bench loading the same model beside it.
            full_mb = math.ceil(info.model_summary(model).expert_bytes * 1.02 / 2**20 + 1)
            config = replace(base, threads=t, repack=repack, ctx=max(base.ctx, prompt_tokens + 256),
                             cache_mb=float(full_mb), flash_attn=ENGINE_FLASH_ATTN[fa])
            with Engine(model, config) as engine:
                engine.run(PROMPT, WARMUP_TOKENS)  # every expert cached, the pool's pages in place
                engine.run(_prompt_ids(engine.tokenize, prompt_tokens, -1), 1)
                for r in range(repeats):
                    engine_first = r % 2 == 0
                    got: dict[str, Any] = {}
                    for which in (("engine", "llama-bench") if engine_first else ("llama-bench", "engine")):
                        if which == "engine":
                            got |= _measure_engine(engine, decode_tokens, prompt_tokens, r)
                        else:
                            lb = llama_bench.run(model, threads=t, decode_tokens=decode_tokens,
                                                 prompt_tokens=prompt_tokens, flash_attn=fa)
                            got |= {"llama_bench_decode_tok_s": lb["decode_tok_s"],
                                    "llama_bench_prompt_tok_s": lb["prompt_tok_s"]}
                    row = KernelRow(model.name, t, repack, r, repack_layouts=str(engine.run_info["repack_layouts"]),
                                    flash_attn_setting=fa, flash_attn=bool(engine.run_info["flash_attn"]),
                                    first="engine" if engine_first else "llama-bench", **got)
                    rows.append(row)
                    say(f"{model.name} t={t} fa={fa} repack={repack} #{r}: decode {row.decode_tok_s:.2f} vs "
                        f"{row.llama_bench_decode_tok_s:.2f} tok/s ({row.decode_ratio:.3f}x), prompt "
                        f"{row.prompt_tok_s:.1f} vs {row.llama_bench_prompt_tok_s:.1f} ({row.prompt_ratio:.3f}x)")
    return rows


def write(rows: Sequence[KernelRow], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "kernels.csv", "w", newline="") as f:
        ratios = ("decode_ratio", "prompt_ratio")
        w = csv.DictWriter(f, fieldnames=[*asdict(rows[0]).keys(), *ratios])
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r) | {k: round(getattr(r, k), 4) for k in ratios})
    (out / "summary.md").write_text(summary(rows))


def summary(rows: Sequence[KernelRow]) -> str:
    """Medians per model, threads and --repack: the engine's tok/s, llama-bench's, and the paired ratios."""
    lines = [f"# bench kernels ({time.strftime('%Y-%m-%d')})", "",
             "Streamed with the cache warm (uncapped), the engine's defaults but --threads, --repack and flash "
             "attention, against the pin's llama-bench (resident, its defaults: repacked kernels) with the same "
             "flash attention setting (`-fa`; `off` is the engine's default, `auto` llama-bench's). Ratios are "
             "medians of per-repeat ratios (engine / llama-bench, measured back to back).", "",
             "| model | threads | --repack | layouts | flash attention (resolved) | decode tok/s | llama-bench tg | "
             "decode ratio | prompt tok/s | llama-bench pp | prompt ratio | repeats |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r.model, r.threads, r.flash_attn_setting, r.repack) for r in rows})
    for model, t, fa, repack in keys:
        group = [r for r in rows if (r.model, r.threads, r.flash_attn_setting, r.repack) == (model, t, fa, repack)]

        def med(values: list[float]) -> float:
            return statistics.median(values) if values else 0.0
        lines.append(
            f"| {model} | {t} | {repack} | {group[0].repack_layouts or '-'} | "
            f"{fa} ({'on' if group[0].flash_attn else 'off'}) | "
            f"{med([r.decode_tok_s for r in group]):.2f} | {med([r.llama_bench_decode_tok_s for r in group]):.2f} | "
            f"{med([r.decode_ratio for r in group]):.3f} | "
            f"{med([r.prompt_tok_s for r in group]):.1f} | {med([r.llama_bench_prompt_tok_s for r in group]):.1f} | "
            f"{med([r.prompt_ratio for r in group]):.3f} | "
            f"{len(group)} |")
    return "\n".join(lines) + "\n"
