"""A campaign as one shareable card (`bench report`): the machine (CPU, cores, RAM, kernel page size), its storage
as `bench io` measured it, the model's shape and quant, the pin and our version, and per cell tok/s, MB read per
token, hit rate and time to first token. Built from what the campaign wrote (run.json, cells.csv, io.csv) and
holding nothing that identifies anyone: no hostname, path, user name, device or command line. Several cards make
one comparison table."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bmoe_edge import __version__
from bmoe_edge.bench.machine import read_csv
from bmoe_edge.errors import BmoeError

CARD_VERSION = 1
MB = 1_000_000
MiB = 1 << 20
# The cells' columns a card keeps (the median over the repeats that ran ok), and how each is shown.
CELL_FIELDS = (("tok_s", "tok/s", 3), ("mb_read_per_token", "MB read/token", 1), ("cache_hit_pct", "hit %", 1),
               ("ttft_ms", "TTFT ms", 0), ("stall_ms_per_token", "stall ms/token", 0))


def _median(rows: Sequence[dict[str, str]], column: str) -> float | None:
    values = [float(r[column]) for r in rows if r.get(column) not in (None, "")]
    return statistics.median(values) if values else None


def _quant(metadata: dict[str, Any]) -> str:
    file_type = metadata.get("general.file_type")
    if file_type is None:
        return ""
    try:
        from gguf import LlamaFileType
        return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except (ImportError, ValueError):
        return str(file_type)


def _storage(out: Path) -> dict[str, Any]:
    """The best throughput each read path reached in the campaign's `bench io` cells, and its p99 latency."""
    path = out / "io.csv"
    rows = read_csv(path) if path.is_file() else []
    best: dict[str, Any] = {}
    for r in rows:
        mode, mib_s = r.get("used") or r.get("mode", ""), float(r.get("mib_s") or 0)
        if mode and mib_s > best.get(mode, {}).get("mb_s", 0) * MB / MiB:
            best[mode] = {"mb_s": round(mib_s * MiB / MB, 1), "read_kb": int(r["size"]) // 1024,
                          "lanes": int(r["lanes"]), "p99_ms": float(r.get("lat_p99_ms") or 0)}
    return best


def _cells(out: Path) -> list[dict[str, Any]]:
    rows = [r for r in read_csv(out / "cells.csv") if r.get("status") == "ok"]
    cells = []
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        read = _median(mine, "storage_bytes_per_token")
        cell: dict[str, Any] = {"label": label, "repeats": len(mine),
                                "tok_s": _median(mine, "tok_s"),
                                "mb_read_per_token": None if read is None else read / MB,
                                "cache_hit_pct": _median(mine, "cache_hit_pct"),
                                "ttft_ms": _median(mine, "ttft_ms"),
                                "stall_ms_per_token": _median(mine, "stall_ms_per_token")}
        cells.append(cell)
    return cells


def card(out: Path) -> dict[str, Any]:
    """The card of the campaign in `out` (a `bench stream --out` directory)."""
    run_path = out / "run.json"
    if not run_path.is_file() or not (out / "cells.csv").is_file():
        raise BmoeError(f"{out}: not a bench stream campaign (no run.json and cells.csv there)")
    try:
        run = json.loads(run_path.read_text())
    except (OSError, ValueError) as exc:
        raise BmoeError(f"{run_path}: not readable as a campaign record ({exc})") from None
    machine = run.get("machine", {})
    metadata = run.get("model_metadata", {})
    storage_class = run.get("storage") or {}
    return {
        "card": CARD_VERSION,
        "bmoe_edge": __version__,
        "llama_pin": machine.get("llama_pin", ""),
        "machine": {"arch": machine.get("machine", ""), "cpu": machine.get("cpu", ""), "cores": machine.get("cores"),
                    "ram_mb": machine.get("mem_total_mb"), "kernel_page_kb": (machine.get("page_size") or 0) // 1024,
                    "kernel": ".".join(str(machine.get("kernel", "")).split(".")[:2])},
        "storage": {"measured": _storage(out), "throttled_to": storage_class.get("name"),
                    "throttle_mb_s": storage_class.get("read_mb_s")},
        "ram_cap_mb": round(run["cap_bytes"] / MiB) if run.get("cap_bytes") else None,
        "model": {"name": metadata.get("general.name", ""), "architecture": metadata.get("general.architecture", ""),
                  "quant": _quant(metadata), "synthetic": metadata.get("bmoe.synthetic.preset", ""),
                  "file_gb": round(run.get("file_bytes", 0) / 1e9, 2), "layers": run.get("n_layer"),
                  "experts": run.get("n_expert"), "experts_per_token": run.get("n_expert_used"),
                  "routed_mb_per_token": round(run.get("routed_bytes_per_token", 0) / MB, 1)},
        "cells": _cells(out),
    }


def _shown(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def card_markdown(c: dict[str, Any]) -> str:
    m, model, storage = c["machine"], c["model"], c["storage"]
    measured = ", ".join(f"{mode} {s['mb_s']} MB/s ({s['read_kb']} KiB reads, {s['lanes']} lanes, p99 {s['p99_ms']} ms)"
                         for mode, s in storage["measured"].items()) or "not measured"
    throttled = f"; reads held to {storage['throttled_to']} ({storage['throttle_mb_s']} MB/s)" \
        if storage.get("throttled_to") else ""
    lines = [
        f"# bmoe-edge {c['bmoe_edge']} on {m['arch']} ({m['cpu'] or 'CPU unknown'})", "",
        f"- machine: {m['cores']} cores, {m['ram_mb']} MB RAM, {m['kernel_page_kb'] or '?'} KiB pages, "
        f"Linux {m['kernel']}"
        + (f", RAM capped at {c['ram_cap_mb']} MiB" if c.get("ram_cap_mb") else ""),
        f"- storage: {measured}{throttled}",
        f"- model: {model['name'] or '?'} ({model['architecture'] or 'architecture ?'}, "
        f"{model['quant'] or 'quant ?'}), "
        f"{model['file_gb']} GB, {model['layers']} layers, {model['experts_per_token']} of {model['experts']} experts "
        f"a token ({model['routed_mb_per_token']} MB routed a token)",
        f"- llama.cpp: {c['llama_pin']}", "",
        "| cell | repeats | " + " | ".join(title for _, title, _ in CELL_FIELDS) + " |",
        "|---|---|" + "---|" * len(CELL_FIELDS),
    ]
    for cell in c["cells"]:
        lines.append(f"| {cell['label']} | {cell['repeats']} | "
                     + " | ".join(_shown(cell[key], digits) for key, _, digits in CELL_FIELDS) + " |")
    return "\n".join(lines) + "\n"


def compare_markdown(cards: Sequence[dict[str, Any]]) -> str:
    """One row per card and cell: where each machine stands, side by side."""
    lines = ["| machine | storage | model | cell | " + " | ".join(title for _, title, _ in CELL_FIELDS) + " |",
             "|---|---|---|---|" + "---|" * len(CELL_FIELDS)]
    for c in cards:
        m, model = c["machine"], c["model"]
        best = max(c["storage"]["measured"].values(), key=lambda s: s["mb_s"], default=None)
        storage = c["storage"].get("throttled_to") or (f"{best['mb_s']} MB/s" if best else "-")
        for cell in c["cells"]:
            lines.append(f"| {m['arch']} {m['cores']}c {m['ram_mb']} MB | {storage} | "
                         f"{model['name'] or model['architecture']} {model['quant']} | {cell['label']} | "
                         + " | ".join(_shown(cell[key], digits) for key, _, digits in CELL_FIELDS) + " |")
    return "\n".join(lines) + "\n"


def load_card(path: Path) -> dict[str, Any]:
    """A card from a campaign directory, or a card.json sent in."""
    if path.is_dir():
        return card(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BmoeError(f"{path}: not a card ({exc})") from None
    if not isinstance(data, dict) or data.get("card") != CARD_VERSION:
        raise BmoeError(f"{path}: not a bench report card (version {CARD_VERSION})")
    return data


def write_card(out: Path) -> tuple[Path, Path]:
    """card.md and card.json beside the campaign's own files."""
    c = card(out)
    (out / "card.json").write_text(json.dumps(c, indent=2) + "\n")
    (out / "card.md").write_text(card_markdown(c))
    return out / "card.md", out / "card.json"
