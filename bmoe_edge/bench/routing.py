"""`bench routing`: which experts the router chooses, per token and layer (the engine's route trace of a
serial, one-lane, cache-off run), their popularity and reuse, and the hit rate of the engine's cache over
that trace."""

from __future__ import annotations

import csv
import itertools
import json
import math
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bmoe_edge.bench.cells import BenchCell, cell_command
from bmoe_edge.bench.layout import gguf_layout
from bmoe_edge.bench.machine import PROMPT, ctx_for
from bmoe_edge.engine import native
from bmoe_edge.errors import BmoeError
from bmoe_edge.units import MiB


def trace_routing(model: Path, tokens: int, workdir: Path, prompt: str = PROMPT,
                  python: Sequence[str] = ()) -> list[list[list[int]]]:
    """Per decoded token, per layer, the experts the router chose: the engine's own route trace of a
    serial, one-lane, cache-off run (`--route-trace`), in a Python started as `python` says (a campaign's cells:
    an emulated board's exec wrapper first; () = sys.executable)."""
    workdir.mkdir(parents=True, exist_ok=True)
    trace = workdir / "route-trace.csv"
    spec = BenchCell("routing-trace", "stream", {"cache_mb": 0, "io_threads": 1, "overlap": False, "threads": 1,
                                            "ctx": ctx_for(tokens), "route_trace": str(trace)},
                     tokens=tokens).spec(model, None)
    spec["prompt"] = prompt
    try:
        subprocess.run(cell_command(spec, python), check=True, capture_output=True, text=True, timeout=3600)
    except subprocess.CalledProcessError as exc:
        raise BmoeError(f"the traced run failed: {exc.stderr.strip()[-400:]}") from None
    steps = read_route_trace(trace)
    trace.unlink()
    return steps[1:]  # step 0 decodes the prompt


def read_route_trace(path: Path) -> list[list[list[int]]]:
    """A route trace (CSV: step,pos,layer,experts) as steps -> layers -> the distinct experts routed
    (ascending). A generation's steps restart at 0: later generations follow the first."""
    steps: list[dict[int, set[int]]] = []
    last_step = None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            step, layer = int(row["step"]), int(row["layer"])
            if step != last_step:
                steps.append({})
                last_step = step
            steps[-1].setdefault(layer, set()).update(int(e) for e in row["experts"].split())
    n_layer = 1 + max((il for s in steps for il in s), default=-1)
    return [[sorted(s.get(il, ())) for il in range(n_layer)] for s in steps]


def cache_hit_rate(trace: list[list[list[int]]], bytes_per_expert: Sequence[int], n_expert: int,
                   budget_bytes: int) -> float:
    """The engine's own cache policy (its ExpertCache, through the bindings) replayed on a routing
    trace: per-layer shares with LRU inside a layer, the layer in flight never evicted; hits / lookups."""
    cache = native.load().parts.ExpertCache(budget_bytes, list(bytes_per_expert), [n_expert] * len(bytes_per_expert))
    hits = lookups = 0
    for token in trace:
        for il, experts in enumerate(token):
            for e in sorted(set(experts)):  # the streamer dedupes a layer's routed ids
                lookups += 1
                if cache.touch(il, e):
                    hits += 1
                else:
                    cache.insert(il, e)
            cache.evict_over_budget(il)
    return hits / lookups if lookups else 0.0


def routing_stats(trace: list[list[list[int]]], n_expert: int, k: int) -> dict[str, Any]:
    """Popularity (per-layer Zipf fit of the selection frequency), previous-token reuse."""
    n_layer = len(trace[0]) if trace else 0
    reuse = []
    for a, b in itertools.pairwise(trace):
        for il in range(n_layer):
            if a[il] and b[il]:
                reuse.append(len(set(a[il]) & set(b[il])) / len(b[il]))
    zipf, top_share = [], []
    freq_rank = [0.0] * n_expert
    for il in range(n_layer):
        counts = [0] * n_expert
        for tok in trace:
            for e in tok[il]:
                counts[e] += 1
        freq = sorted((c / len(trace) for c in counts), reverse=True)
        for r, f in enumerate(freq):
            freq_rank[r] += f / n_layer
        zipf.append(_zipf_slope(freq))
        top_share.append(sum(freq[: max(1, n_expert // 8)]) / max(1e-9, sum(freq)))
    return {
        "tokens": len(trace), "layers": n_layer,
        "prev_token_reuse": round(statistics.mean(reuse), 4) if reuse else 0.0, "chance_reuse": round(k / n_expert, 4),
        "zipf_per_layer_median": round(statistics.median(zipf), 3) if zipf else 0,
        "zipf_of_mean_ranked_freq": round(_zipf_slope(freq_rank), 3),
        "top_eighth_share_median": round(statistics.median(top_share), 4) if top_share else 0,
        "mean_ranked_freq": [round(f, 4) for f in freq_rank],
        "experts_touched_per_layer": round(statistics.mean(
            len({e for tok in trace for e in tok[il]}) for il in range(n_layer)), 2) if n_layer else 0,
    }


def _zipf_slope(freq: Sequence[float]) -> float:
    """-slope of log(frequency) on log(rank), leaving out saturated (always chosen) and unseen ranks."""
    pts = [(math.log(r + 1), math.log(f)) for r, f in enumerate(sorted(freq, reverse=True)) if 0 < f < 0.99]
    if len(pts) < 3:
        return 0.0
    mx = statistics.mean(p[0] for p in pts)
    my = statistics.mean(p[1] for p in pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return round(-sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx, 4) if sxx else 0.0


def routing_report(model: Path, tokens: int, out: Path, budgets_mb: Sequence[float] = (),
                   python: Sequence[str] = ()) -> dict[str, Any]:
    layout = gguf_layout(model)
    trace = trace_routing(model, tokens, out, python=python)
    stats = routing_stats(trace, layout.n_expert, layout.n_expert_used)
    per_layer = [layout.bytes_per_expert(il) for il in sorted(layout.layers())]
    budgets = list(budgets_mb) or [0, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048,
                                   math.ceil(layout.all_expert_bytes / MiB)]
    stats["cache_hit_rate"] = {str(b): round(100 * cache_hit_rate(trace, per_layer, layout.n_expert, int(b * MiB)), 2)
                               for b in budgets}
    stats["model_metadata"] = {k: v for k, v in layout.metadata.items() if k.startswith("bmoe.")}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "routing.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["token", "layer", "experts"])
        for t, tok in enumerate(trace):
            for il, experts in enumerate(tok):
                w.writerow([t, il, " ".join(map(str, experts))])
    (out / "routing.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def load_trace(path: Path) -> list[list[list[int]]]:
    tokens: dict[int, dict[int, list[int]]] = {}
    with open(path) as f:
        for row in csv.DictReader(f):
            tokens.setdefault(int(row["token"]), {})[int(row["layer"])] = [int(e) for e in row["experts"].split()]
    return [[tok[il] for il in sorted(tok)] for _, tok in sorted(tokens.items())]
