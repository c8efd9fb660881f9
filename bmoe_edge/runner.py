"""Headless generation: resolve the configuration (board profile, then flags), run, stream out."""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import IO

from bmoe_edge import profiles, report
from bmoe_edge.engine import Engine, Generation, Sampling, StreamConfig
from bmoe_edge.errors import BmoeError

PROFILE_KNOBS = ("threads", "io_threads", "read_path", "cache_mb", "cache_floor_mb", "cache_ceil_mb", "dense",
                 "overlap")


def parse_cache_mb(value: str) -> float | str:
    if value == "auto":
        return "auto"
    try:
        mb = float(value)
    except ValueError:
        raise BmoeError(f"--cache-mb must be a number of MiB or 'auto', got {value!r}") from None
    if mb < 0:
        raise BmoeError(f"--cache-mb must be >= 0 (0 = no cache) or 'auto', got {value}")
    return mb


def resolve_config(board: str | None, overrides: dict[str, object]) -> StreamConfig:
    """Defaults, then the board profile's engine defaults, then explicit flags (None = not given)."""
    values: dict[str, object] = {}
    if board:
        profile = profiles.load_profile(board)
        for knob in PROFILE_KNOBS:
            value = getattr(profile, knob)
            if value is not None:
                values[knob] = value
    known = {f.name for f in fields(StreamConfig)}
    values.update({k: v for k, v in overrides.items() if v is not None and k in known})
    return replace(StreamConfig(), **values)


@dataclass(frozen=True)
class Outputs:
    as_json: bool = False
    progress: bool = False
    csv_path: Path | None = None
    summary: bool = True


def generate(model: Path, prompt: str, max_tokens: int, config: StreamConfig, sampling: Sampling,
             outputs: Outputs, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> Generation:
    """Print tokens as they come (text, or one JSON object per token), then a summary."""
    with Engine(model, config) as engine:
        info = engine.run_info
        if outputs.as_json:
            print(report.json_line({"type": "run", **info}), file=out, flush=True)
        elif outputs.progress:
            print(report.run_header(info), file=err, flush=True)
        csv_out = report.MetricsCsv(outputs.csv_path, info) if outputs.csv_path else None
        result = Generation([])
        try:
            for token in engine.generate(prompt, max_tokens, sampling, result=result):
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
