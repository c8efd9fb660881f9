"""Telemetry out: per-token rows (CSV by column name, JSON lines), progress lines, run summaries."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import IO

from bmoe_edge.engine.generation import Generation, TokenMetrics

METRIC_COLUMNS = tuple(f.name for f in fields(TokenMetrics))


def progress_line(m: TokenMetrics) -> str:
    hit = f"{100 * m.cache_hits / m.cache_lookups:.0f}%" if m.cache_lookups else "-"
    return (f"[step {m.step:>4}] {m.wall_ms:8.1f} ms  io {m.io_ms:7.1f}  stall {m.stall_ms:7.1f}  "
            f"read {m.bytes_read / 2**20:7.2f} MiB  hit {hit:>4}  evict {m.evictions:>4}  "
            f"majflt {m.major_faults:>3}  rss {m.rss_bytes / 2**20:7.1f} MiB  "
            f"budget {m.cache_budget_bytes / 2**20:7.1f} MiB")


class MetricsCsv:
    """Per-token metrics as CSV; columns are named so readers never depend on their order."""

    def __init__(self, path: Path, run_info: dict[str, object]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(path, "w", newline="")  # noqa: SIM115 - closed in close()
        self._writer = csv.DictWriter(self._file, fieldnames=("model", "read_path", *METRIC_COLUMNS))
        self._writer.writeheader()
        self._fixed = {"model": run_info.get("model", ""), "read_path": run_info.get("read_path", "")}

    def write(self, m: TokenMetrics) -> None:
        self._writer.writerow(self._fixed | asdict(m))

    def close(self) -> None:
        self._file.close()


def summary(gen: Generation, run_info: dict[str, object]) -> dict[str, object]:
    """Totals of a generation: decode speed excludes the prompt step."""
    decode = gen.metrics[1:]
    decode_ms = sum(m.wall_ms for m in decode)
    lookups = sum(m.cache_lookups for m in gen.metrics)
    n_decode = len(decode)
    return {
        "prompt_tokens": len(gen.prompt_tokens),
        "generated_tokens": len(gen.tokens),
        "stop_reason": gen.stop_reason,
        **prefill(gen),
        "decode_tok_s": 1000.0 * n_decode / decode_ms if decode_ms > 0 else 0.0,
        "bytes_read": sum(m.bytes_read for m in gen.metrics),
        "bytes_read_per_token": sum(m.bytes_read for m in decode) / n_decode if n_decode else 0.0,
        "copy_bytes": sum(m.copy_bytes for m in gen.metrics),
        "cache_hit_pct": 100.0 * sum(m.cache_hits for m in gen.metrics) / lookups if lookups else 0.0,
        "stall_ms": sum(m.stall_ms for m in gen.metrics),
        "io_ms": sum(m.io_ms for m in gen.metrics),
        "major_faults": sum(m.major_faults for m in gen.metrics),
        "peak_rss_bytes": max((m.rss_bytes for m in gen.metrics), default=0),
        # Speculative decoding: draft tokens decoded, those the model agreed with, decodes run.
        "drafted": sum(m.drafted for m in gen.metrics),
        "accepted": sum(m.accepted for m in gen.metrics),
        "probed": sum(m.probed for m in gen.metrics),  # drafts checked against the step's own token instead
        "decodes": sum(1 for m in decode if m.n_tokens > 0),
        # Read-ahead (--prefetch): decodes that guessed, slots guessed and right, bytes read for guesses.
        "read_ahead_decodes": sum(1 for m in decode if m.read_ahead),
        "predicted": sum(m.predicted for m in gen.metrics),
        "predicted_correct": sum(m.predicted_correct for m in gen.metrics),
        "ahead_bytes": sum(m.ahead_bytes for m in gen.metrics),
        "ahead_wasted_bytes": sum(m.ahead_wasted_bytes for m in gen.metrics),
        # RPC workers: what crossed the network (the prompt step apart: it carries the whole prompt)
        "net_bytes": sum(m.net_bytes for m in gen.metrics),
        "net_bytes_per_token": sum(m.net_bytes for m in decode) / n_decode if n_decode else 0.0,
        "run": run_info,
    }


def prefill(gen: Generation) -> dict[str, float | int]:
    """The prompt's step: what it decoded (the prompt less what the context held), how fast, what it read
    against the distinct experts it routed to (one read of each), and the time to the first token."""
    first = gen.metrics[0] if gen.metrics else None
    ms = first.wall_ms if first else 0.0
    decoded = first.n_tokens if first else 0
    return {
        "prompt_reused_tokens": gen.reused_tokens,
        "prompt_decoded_tokens": decoded,
        "prompt_ms": ms,
        "prompt_tok_s": 1000.0 * decoded / ms if ms > 0 else 0.0,
        "prefill_bytes": first.bytes_read if first else 0,
        "prefill_routed_bytes": first.routed_bytes if first else 0,
        "prefill_released_bytes": first.released_bytes if first else 0,
        "ttft_ms": gen.ttft_ms,
    }


def prefill_line(s: dict[str, object]) -> str:
    routed = int(str(s["prefill_routed_bytes"]))
    ratio = f", {int(str(s['prefill_bytes'])) / routed:.2f}x the distinct experts routed" if routed else ""
    return (f"prompt: {s['prompt_tokens']} tokens ({s['prompt_reused_tokens']} reused), "
            f"{s['prompt_decoded_tokens']} decoded in {float(str(s['prompt_ms'])):.0f} ms "
            f"({float(str(s['prompt_tok_s'])):.1f} tok/s); read {int(str(s['prefill_bytes'])) / 2**20:.1f} MiB{ratio}; "
            f"first token after {float(str(s['ttft_ms'])):.0f} ms")


def memory_line(run: dict[str, object]) -> str:
    """Why the cache budget is what it is: the limit that binds and what the process needs."""
    if not run.get("streaming") or run.get("cache_mode") == "off" or not run.get("memory_limit_source"):
        return ""
    line = (f"memory: limit {float(str(run['memory_limit_mb'])):.0f} MiB ({run['memory_limit_source']}); "
            f"left for the cache {float(str(run['memory_headroom_mb'])):.0f} MiB after the process, "
            f"{float(str(run['memory_pending_mb'])):.0f} MiB of buffers still to touch and the margin; "
            f"budget {float(str(run['cache_budget_mb'])):.0f} MiB"
            + (", adapts to pressure" if run.get("cache_adaptive") else ""))
    return line  # a clamped or useless budget is said in the run's warning


def repack_line(run: dict[str, object]) -> str:
    """llama.cpp's repacked kernels: the layout each streamed type computes in, and the dense weights repacked."""
    dense = int(str(run.get("repacked_dense_tensors", 0)))
    layouts = run.get("repack_layouts") or "on the plain kernels, read in place (the cache cannot hold them all)"
    return (f"repack {run['repack']}: experts {layouts}; dense {dense} tensors, "
            f"{int(str(run.get('repacked_dense_bytes', 0))) / 2**20:.1f} MiB repacked at load")


def run_header(run: dict[str, object]) -> str:
    """The resolved configuration of a run: two lines, and a third with the memory the cache was sized from."""
    memory = memory_line(run)
    return "\n".join([
        f"model {run['model']} ({run['architecture']}, {run['n_expert']} experts, {run['n_expert_used']} used)",
        f"streaming {'on' if run['streaming'] else 'off'}; read path {run['read_path'] or '-'}"
        + (f" ({run['read_path_note']})" if run["read_path_note"] else "")
        + f"; cache {run['cache_mode']} {float(str(run['cache_budget_mb'])):.1f} MiB; lanes {run['io_threads']};"
        f" overlap {'on' if run['overlap'] else 'off'}; prefetch {run.get('prefetch', 'off')};"
        f" dense {run['dense']}; threads {run['threads']};"
        f" load {float(str(run['load_ms'])):.0f} ms, {int(str(run['load_bytes_read'])) / 2**20:.1f} MiB read",
        *([memory] if memory else []),
        *([repack_line(run)] if run.get("streaming") and run.get("repack", "off") != "off" else []),
        *([f"layers: {run['placement']}"] if run.get("placement") else []),
        *([f"LOSSY: {run['lossy']} (the output is not the model's)"] if run.get("lossy") else []),
    ])


def summary_text(s: dict[str, object]) -> str:
    run = s["run"]
    assert isinstance(run, dict)
    lines = [
        run_header(run),
        f"{s['generated_tokens']} tokens, {float(s['decode_tok_s']):.2f} tok/s decode; "
        f"read {int(s['bytes_read']) / 2**20:.1f} MiB ({float(s['bytes_read_per_token']) / 2**20:.2f} MiB/token); "
        f"hit {float(s['cache_hit_pct']):.1f}%; stall {float(s['stall_ms']):.0f} ms; "
        f"peak RSS {int(s['peak_rss_bytes']) / 2**20:.0f} MiB; stop: {s['stop_reason']}",
    ]
    lines.append(prefill_line(s))
    if int(s.get("net_bytes", 0)):
        lines.append(f"RPC network: {int(s['net_bytes']) / 2**20:.2f} MiB, "
                     f"{float(s['net_bytes_per_token']) / 2**10:.1f} KiB/token")
    if int(s.get("drafted", 0)) or int(s.get("probed", 0)):
        per_decode = int(s["generated_tokens"]) / max(1, int(s["decodes"]) + 1)
        probes = f"; {s['probed']} probes after drafts rejected outright" if int(s.get("probed", 0)) else ""
        lines.append(f"speculative: {s['accepted']} of {s['drafted']} drafted tokens accepted, "
                     f"{per_decode:.2f} tokens per decode{probes}")
    if run.get("prefetch", "off") != "off":
        lines.append(prefetch_line(s, run))
    if run.get("warning"):
        lines.append(f"warning: {run['warning']}")
    return "\n".join(lines)


def prefetch_line(s: dict[str, object], run: dict[str, object]) -> str:
    """How read-ahead did: guesses right, bytes it read in vain, and in how many decodes it ran."""
    if run.get("prefetch_note"):
        return f"prefetch {run['prefetch']}: off, {run['prefetch_note']}"
    predicted = int(str(s["predicted"]))
    right = 100.0 * int(str(s["predicted_correct"])) / predicted if predicted else 0.0
    return (f"prefetch {run['prefetch']}: read ahead in {s['read_ahead_decodes']} of {s['decodes']} decodes; "
            f"{right:.1f}% of {predicted} guessed slots right; "
            f"read ahead {int(str(s['ahead_bytes'])) / 2**20:.1f} MiB, "
            f"{int(str(s['ahead_wasted_bytes'])) / 2**20:.1f} MiB of it for wrong guesses")


def json_line(record: dict[str, object]) -> str:
    return json.dumps(record, separators=(",", ":"))
