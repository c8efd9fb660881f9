"""A finished campaign's plots (matplotlib): tok/s per config, hit rate vs cache budget, where the
time goes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bmoe_edge.bench.machine import read_csv
from bmoe_edge.bench.summary import KIND_ORDER, aggregate, targets, to_num
from bmoe_edge.units import MiB


def plots(out: Path, routing: dict[str, Any] | None = None) -> list[Path]:
    """tokps.png (tok/s per config, mmap baseline and the I/O ceiling), hitrate.png (hit rate vs cache
    budget: measured cells and the LRU replay of the routing trace), split.png (where the time goes)."""
    import matplotlib  # host-only (the host extra): imported when plotting, so the module imports anywhere

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = read_csv(out / "cells.csv")
    meta = json.loads((out / "run.json").read_text())
    aggs = aggregate(cells)
    t = targets(out)
    written = []
    name = Path(meta["model"]).name
    ok = sorted((a for a in aggs.values() if a.tok_s and a.kind != "io"),
                key=lambda a: (KIND_ORDER.get(a.kind, 9), a.tok_s_med))
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(ok) + 1.8))
    colors = {"resident": "tab:green", "mmap": "tab:red", "stream": "tab:blue"}
    ys = range(len(ok))
    ax.barh(list(ys), [a.tok_s_med for a in ok], color=[colors.get(a.kind, "gray") for a in ok],
            xerr=[[a.tok_s_med - min(a.tok_s) for a in ok], [max(a.tok_s) - a.tok_s_med for a in ok]], capsize=3)
    ax.set_yticks(list(ys), [a.label + ("" if a.rows[0].get("cap_method") not in ("", "none") else " (no cap)")
                             for a in ok], fontsize=8)
    ax.set_xscale("log")
    if "mmap" in aggs and aggs["mmap"].tok_s:
        ax.axvline(aggs["mmap"].tok_s_med, color="tab:red", ls="--",
                   label=f"llama.cpp mmap {aggs['mmap'].tok_s_med:.2f}")
    if "ceiling_tok_s" in t:
        ax.axvline(t["ceiling_tok_s"], color="black", ls=":", label=f"I/O ceiling (cache off) {t['ceiling_tok_s']:.2f}")
    ax.set_xlabel("decode tok/s (median, min-max over repeats; log scale)")
    ax.set_title(f"{name}: cap {meta['cap_bytes'] / MiB:.0f} MiB ({100 * meta['cap_bytes'] / meta['file_bytes']:.0f}%)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper center", framealpha=0.9)
    fig.tight_layout()
    p = out / "tokps.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    pts = [(to_num(r["cache_budget_mb"]), to_num(r["cache_hit_pct"])) for r in cells
           if r.get("status") == "ok" and r["kind"] == "stream" and r.get("cap_method") not in ("", "none")]
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label="measured (under the cap)", zorder=3)
    full = [(to_num(r["cache_budget_mb"]), to_num(r["cache_hit_pct"])) for r in cells
            if r.get("status") == "ok" and r["label"].startswith("fullcache")]
    if full:
        ax.scatter([p[0] for p in full], [p[1] for p in full], marker="s", label="full cache, after a warm-up pass")
    routing = routing or (json.loads((out / "routing.json").read_text()) if (out / "routing.json").exists() else None)
    if routing and routing.get("cache_hit_rate"):
        curve = sorted((float(k), v) for k, v in routing["cache_hit_rate"].items())
        ax.plot([c[0] for c in curve], [c[1] for c in curve], "-", color="gray",
                label=f"LRU replay of the traced routing ({routing['tokens']} tokens, cold)")
    ax.set_xscale("symlog", linthresh=64)
    ax.set_xlabel("cache budget (MiB)")
    ax.set_ylabel("cache hit %")
    ax.set_title(f"{name}: hit rate vs cache budget", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "hitrate.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)

    st = sorted((a for a in aggs.values() if a.kind in ("stream", "resident") and a.tok_s),
                key=lambda a: a.med("ms_per_token"))
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(st) + 1.8))
    ys = list(range(len(st)))
    comp = [a.med("compute_ms_per_token") - a.med("drain_ms_per_token") for a in st]
    stall = [a.med("stall_ms_per_token") for a in st]
    drain = [a.med("drain_ms_per_token") for a in st]
    ax.barh(ys, comp, color="tab:green", label="compute (wall - stall - drain)")
    ax.barh(ys, stall, left=comp, color="tab:orange", label="stall (waiting for reads)")
    ax.barh(ys, drain, left=[c + s for c, s in zip(comp, stall, strict=True)], color="tab:purple",
            label="drain (previous layer's reads)")
    ax.scatter([a.med("io_ms_per_token") for a in st], ys, marker="|", s=200, color="black", zorder=3,
               label="io (reads in flight)")
    ax.set_yticks(ys, [a.label for a in st], fontsize=8)
    ax.set_xlabel("ms per token (median)")
    ax.set_title(f"{name}: where the time goes", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    p = out / "split.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    written.append(p)
    return written
