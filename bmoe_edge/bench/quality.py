"""`bench quality`: what a lossy knob costs, against the lossless model on the same machine.

Each setting is compared with the lossless run in two ways: greedy generation from a prompt (how
many tokens agree, position by position, and where the first difference is) and the perplexity of
a text scored teacher-forced (the mean negative log-likelihood per token, exponentiated). A lossy
setting is any mix of the engine's lossy knobs (the settings rows marked lossy), e.g. `n_expert_used=6` or
`drop_cold=0.05`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bmoe_edge.engine import Engine, Generation, StreamConfig, settings
from bmoe_edge.errors import BmoeError

LOSSY_SETTINGS = tuple(s.name for s in settings.LOSSY_SETTINGS)
DEFAULT_PROMPT = "The history of the printing press begins"
# Plain English prose (written for this project): the text whose perplexity each setting is scored on.
DEFAULT_TEXT = (
    "The printing press changed how knowledge moved. Before it, a book was copied by hand, one page at a "
    "time, and a library of a few hundred volumes was a treasure. Within fifty years of the first presses, "
    "millions of books had been printed, and the price of a book fell so far that merchants, students and "
    "craftsmen could own them. Ideas that once took a generation to cross a continent now travelled in "
    "months. Scholars could compare the same text in the same form, correct its errors and print the "
    "corrections, so that knowledge began to accumulate instead of decaying with every copy."
)


@dataclass
class QualityRow:
    setting: str            # "lossless" or the lossy knobs, e.g. "drop_cold=0.05"
    lossy: str              # what the engine says makes the run lossy ("" for the reference)
    agree_pct: float        # generated tokens equal to the lossless run's, position by position
    first_difference: int | None  # the first position that differs (None: all agree)
    perplexity: float
    perplexity_delta_pct: float   # against the lossless run
    dropped_per_token: float      # drop_cold: routed slots skipped per generated token
    bytes_read_per_token: float
    decode_tok_s: float


def parse_lossy(spec: str) -> dict[str, object]:
    """`n_expert_used=6,drop_cold=0.05` -> settings, each checked by its row of the settings table."""
    values: dict[str, object] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, raw = part.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in LOSSY_SETTINGS:
            raise BmoeError(f"--lossy {spec!r}: expected NAME=VALUE with NAME one of {', '.join(LOSSY_SETTINGS)}")
        values[name] = settings.BY_NAME[name].check(raw.strip())
    if not values:
        raise BmoeError("--lossy needs at least one NAME=VALUE")
    return values


def _run(model: Path, config: StreamConfig, prompt: str, tokens: int, text: str) -> tuple[Generation, list[float], str]:
    with Engine(model, config) as engine:
        gen = engine.run(prompt, tokens)
        logprobs = engine.score(engine.tokenize(text))
        return gen, logprobs, str(engine.run_info.get("lossy", ""))


def _row(setting: str, lossy: str, gen: Generation, logprobs: list[float], ref: Generation | None,
         ref_ppl: float | None) -> QualityRow:
    ppl = math.exp(-sum(logprobs) / len(logprobs))
    decode = gen.metrics[1:]
    decode_ms = sum(m.wall_ms for m in decode)
    n = max(1, len(decode))
    if ref is None:
        agree, first = 100.0, None
    else:
        pairs = list(zip(ref.tokens, gen.tokens, strict=False))
        agree = 100.0 * sum(a == b for a, b in pairs) / max(1, len(ref.tokens))
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
        if first is None and len(gen.tokens) != len(ref.tokens):
            first = len(pairs)
    return QualityRow(
        setting=setting, lossy=lossy, agree_pct=round(agree, 2), first_difference=first,
        perplexity=round(ppl, 4),
        perplexity_delta_pct=round(100.0 * (ppl / ref_ppl - 1), 3) if ref_ppl else 0.0,
        dropped_per_token=round(sum(m.dropped for m in decode) / n, 3),
        bytes_read_per_token=round(sum(m.bytes_read for m in decode) / n),
        decode_tok_s=round(1000.0 * len(decode) / decode_ms, 3) if decode_ms else 0.0,
    )


def bench_quality(model: Path, base: StreamConfig, lossy: list[dict[str, object]], *, prompt: str = DEFAULT_PROMPT,
                  tokens: int = 64, text: str = DEFAULT_TEXT) -> list[QualityRow]:
    """The lossless reference first, then each lossy setting, all with `base`'s other settings."""
    for values in lossy:
        if not values:
            raise BmoeError("an empty lossy setting")
    ref_gen, ref_lp, _ = _run(model, base, prompt, tokens, text)
    ref = _row("lossless", "", ref_gen, ref_lp, None, None)
    rows = [ref]
    for values in lossy:
        config = replace(base, **values)  # type: ignore[arg-type]
        gen, lp, said = _run(model, config, prompt, tokens, text)
        if not said:
            raise BmoeError(f"the engine did not mark {values} as lossy: refusing to report it as a lossy setting")
        name = ",".join(f"{k}={v}" for k, v in values.items())
        rows.append(_row(name, said, gen, lp, ref_gen, ref.perplexity))
    return rows


def quality_table(rows: list[QualityRow]) -> str:
    lines = ["| setting | tokens agree | first difference | perplexity | delta | dropped/token | MiB read/token "
             "| tok/s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        first = "-" if r.first_difference is None else str(r.first_difference)
        lines.append(f"| {r.setting} | {r.agree_pct:.1f}% | {first} | {r.perplexity:.4g} | "
                     f"{r.perplexity_delta_pct:+.2f}% | {r.dropped_per_token:.2f} | "
                     f"{r.bytes_read_per_token / 2**20:.1f} | {r.decode_tok_s:.2f} |")
    return "\n".join(lines) + "\n"


def write_quality(rows: list[QualityRow], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    (out / "quality.md").write_text(quality_table(rows))
