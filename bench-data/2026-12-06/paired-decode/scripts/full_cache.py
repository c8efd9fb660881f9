"""The engine these scripts measure: this machine's defaults, a fixed cache of every expert (bench kernels' own
rule, `kernels.full_cache_mb`), repacked kernels, flash attention off; `resident` for the same without streaming."""
from dataclasses import replace
from pathlib import Path

from bmoe_edge.bench import kernels
from bmoe_edge.boards import profiles
from bmoe_edge.engine import settings


def config(model: Path, threads: int, ctx: int = 256, mode: str = "stream"):
    base = settings.resolve(profiles.load_profile(profiles.machine_board()).engine, {})
    cfg = replace(base, threads=threads, repack="auto", ctx=ctx, flash_attn=False, cache_mb=kernels.full_cache_mb(model))
    return replace(cfg, stream=False) if mode == "resident" else cfg
