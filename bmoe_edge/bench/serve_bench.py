"""`bench serve`: concurrent streaming clients (OpenAI's own client) against a real `serve` under the RAM cap.

A cell is one server (`--parallel P`) and C clients that start together, each streaming its own greedy
completion: aggregate and per-client tok/s, each client's time to first token, and from the server's /metrics
the batches' union vs summed expert bytes and the worst inter-token gap. A gap cell streams one client while
a second sends a long prompt: the first client's longest wait between two tokens against the prompt's chunks.
Cells are interleaved within each repeat (the machine is shared and noisy: compare ratios within a repeat).
"""

from __future__ import annotations

import csv
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bmoe_edge.bench import ramcap
from bmoe_edge.bench.defaults import PREFILL_CHUNK
from bmoe_edge.errors import BmoeError

PROMPTS = (
    "Once upon a time in a small village by the sea",
    "The quick brown fox jumps over the lazy dog and",
    "In the beginning the engineers built a board that",
    "An old sailor said to the children on the beach",
    "The rain in the mountains fell for three days and",
    "A robot walked into the library and asked for",
    "Every morning the baker opened the shop and",
    "The river ran past the mill where the miller",
)


@dataclass(frozen=True)
class ServeCell:
    label: str
    parallel: int
    clients: int
    long_prompt: int = 0      # a gap cell: the second client's prompt length, tokens
    chunk: int = PREFILL_CHUNK.value
    env: tuple[tuple[str, str], ...] = ()   # the server's extra environment (an A/B of a hidden switch)


@dataclass
class ClientRow:
    model: str
    repeat: int
    cell: str
    client: int
    ttft_s: float
    tokens: int
    decode_tok_s: float       # (tokens - 1) / (last token - first token)
    end_s: float              # from the common start to its last token
    worst_gap_s: float


@dataclass
class CellRow:
    model: str
    repeat: int
    cell: str
    parallel: int
    clients: int
    tokens: int
    wall_s: float             # the common start to the last client's last token
    aggregate_tok_s: float
    first_ttft_s: float
    last_ttft_s: float
    steps: float
    batch_tokens: float
    union_bytes: float
    summed_bytes: float
    server_worst_gap_s: float
    long_prompt: int = 0
    long_prompt_s: float = 0.0   # a gap cell: the long prompt's request, start to first token
    max_rss_bytes: int = 0
    cap_bytes: int = 0
    bytes_read: float = 0.0       # the server's expert reads in the cell, each step once (warm-up not counted)
    decode_bytes_read: float = 0.0    # ... of its decode-only steps (--parallel > 1; 0 for one at a time)
    read_stall_s: float = 0.0     # summed over the requests (a shared step's once per sequence in it)
    note: str = ""


@dataclass
class _Client:
    times: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


def default_cells(clients: list[int], long_prompt: int, chunk: int) -> list[ServeCell]:
    """Today's one-at-a-time server with 1 and with the most clients, and --parallel (the most clients) with each
    count; a gap cell chunked, and one at the largest chunk a step of serve's batch takes."""
    top = max(clients)
    cells = [ServeCell("p1-c1", 1, 1, chunk=chunk)]
    cells += [ServeCell(f"p{top}-c{n}", top, n, chunk=chunk) for n in sorted(set(clients)) if top > 1]
    if top > 1:
        cells.append(ServeCell(f"p1-c{top}", 1, top, chunk=chunk))
    if long_prompt:
        cells.append(ServeCell(f"gap-chunk{chunk}", 2, 2, long_prompt, chunk))
        # serve's batch is 512: a step takes at most 510 prompt tokens beside two slots (the unchunked contrast)
        cells.append(ServeCell("gap-chunk512", 2, 2, long_prompt, 512))
    return cells


# `--cache-ab`: every cell also with the expert cache as it was before issue 30 (LRU, equal shares).
CACHE_AB = ("-lru", (("BMOE_CACHE_POLICY", "lru"),))


def with_ab(cells: list[ServeCell], suffix: str, env: tuple[tuple[str, str], ...]) -> list[ServeCell]:
    """Each cell, then its twin with `env` and the label + `suffix`: interleaved, so both see the same machine."""
    return [c for cell in cells for c in (cell, replace(cell, label=cell.label + suffix, env=cell.env + env))]


def _start(model: Path, cell: ServeCell, cap: ramcap.MemCap, threads: int, ctx: int, log: Path,
           python: list[str]) -> tuple[subprocess.Popen, str, str]:
    args = [*python, "-m", "bmoe_edge", "serve", "-m", str(model), "--port", "0", "-t", str(threads), "--ctx", str(ctx),
            "--parallel", str(cell.parallel), "--prefill-chunk", str(cell.chunk), "--queue", "16"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=cap.preexec, env={**os.environ, **dict(cell.env)})
    assert process.stderr is not None
    deadline = time.monotonic() + 300
    seen = ""
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen += line
        if not line and process.poll() is not None:
            raise BmoeError(f"bench serve: the server exited ({process.returncode}): {seen.strip()[-400:]}")
        found = re.search(r"serving (\S+) on (http://[\d.]+:\d+)/v1", line)
        if found:
            def keep(head: str = seen) -> None:   # the server's lines, for a cell that fails
                with log.open("a") as f:
                    f.write(head)
                    for rest in process.stderr:  # type: ignore[union-attr]
                        f.write(rest)
            threading.Thread(target=keep, daemon=True).start()
            return process, found[2], found[1]
    process.kill()
    raise BmoeError("bench serve: the server did not start in 300 s")


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    return {name: float(value) for name, value in re.findall(r"^(\w+) (\S+)$", text, re.M)}


def _stream(url: str, model: str, prompt: str | list[int], max_tokens: int, out: _Client,
            start: threading.Barrier | None, after: threading.Event | None = None) -> None:
    """One streaming completion, each token's arrival timed. The standard library's HTTP, not OpenAI's client:
    `bench serve` runs on a board, whose bundle does not carry the client the tests speak with."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=600)
    if start is not None:
        start.wait()
    if after is not None:
        after.wait()
    try:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "stream": True})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise BmoeError(f"HTTP {response.status}: {response.read(300).decode(errors='replace')}")
        for line in response:   # server-sent events: a "data: {chunk}" line a token (no stop strings hold text back)
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise BmoeError(f"the stream failed: {chunk['error']}")
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                out.times.append(time.perf_counter())
                out.tokens += 1
    except Exception as exc:  # a failed client is recorded, the cell goes on
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


def run_cell(model: Path, label: str, cell: ServeCell, repeat: int, *, cap_bytes: int, cap_method: str,
             tokens: int, threads: int, ctx: int, log: Path,
             python: list[str] | None = None) -> tuple[CellRow, list[ClientRow]]:
    """One cell: a server started with `python` (default this Python; an emulated board's goes through its exec
    wrapper), warmed, its clients run together, its metrics before and after."""
    cap = ramcap.make_cap(cap_bytes, cap_method)
    cap.prepare()
    process, url, model_id = _start(model, cell, cap, threads, ctx, log, python or [sys.executable])
    try:
        warm = _Client()
        _stream(url, model_id, "Warm up", 4, warm, None)   # the dense weights' first reads are not a client's
        before = _metrics(url)
        n_clients = cell.clients
        clients = [_Client() for _ in range(n_clients)]
        start = threading.Barrier(n_clients + 1)
        threads_: list[threading.Thread] = []
        long_started = threading.Event()
        for i in range(n_clients):
            if cell.long_prompt and i == 1:   # after the first client's first tokens: a long prompt beside it
                prompt: str | list[int] = [100 + (k * 7) % 3000 for k in range(cell.long_prompt)]
                t = threading.Thread(target=_stream, args=(url, model_id, prompt, 4, clients[i], start,
                                                            long_started))
            else:
                t = threading.Thread(target=_stream, args=(url, model_id, PROMPTS[i % len(PROMPTS)], tokens,
                                                            clients[i], start))
            t.start()
            threads_.append(t)
        start.wait()
        t0 = time.perf_counter()
        long_t0 = 0.0
        if cell.long_prompt:
            while len(clients[0].times) < 4 and threads_[0].is_alive():
                time.sleep(0.01)
            long_t0 = time.perf_counter()
            long_started.set()
        for t in threads_:
            t.join()
        try:
            after = _metrics(url)
        except OSError:   # the server is gone (the cap's OOM killer: the cell's note says)
            after = before
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        result = cap.finish()
    rows = []
    for i, c in enumerate(clients):
        gaps = [b - a for a, b in zip(c.times, c.times[1:], strict=False)]
        first, last = (c.times[0], c.times[-1]) if c.times else (t0, t0)
        rows.append(ClientRow(label, repeat, cell.label, i, first - t0, c.tokens,
                              (len(c.times) - 1) / (last - first) if last > first else 0.0, last - t0,
                              max(gaps, default=0.0)))

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    measured = [r for i, r in enumerate(rows) if not (cell.long_prompt and i == 1)]
    wall = max((r.end_s for r in measured), default=0.0)
    total = sum(r.tokens for r in measured)
    errors = "; ".join(c.error for c in clients if c.error)
    row = CellRow(label, repeat, cell.label, cell.parallel, cell.clients, total, wall,
                  total / wall if wall > 0 else 0.0, min(r.ttft_s for r in measured),
                  max(r.ttft_s for r in measured), delta("bmoe_batch_steps_total"), delta("bmoe_batch_tokens_total"),
                  delta("bmoe_batch_union_expert_bytes_total"), delta("bmoe_batch_summed_expert_bytes_total"),
                  after.get("bmoe_inter_token_gap_seconds_max", 0.0), cell.long_prompt,
                  (clients[1].times[0] - long_t0) if cell.long_prompt and clients[1].times else 0.0,
                  result.max_usage_bytes, cap_bytes,
                  delta("bmoe_batch_bytes_read_total") if cell.parallel > 1 else delta("bmoe_expert_bytes_read_total"),
                  delta("bmoe_batch_decode_bytes_read_total") if cell.parallel > 1
                  else delta("bmoe_expert_bytes_read_total") - delta("bmoe_prefill_bytes_read_total"),
                  delta("bmoe_read_stall_seconds_total"),
                  "; ".join(x for x in (errors, result.note, f"{result.oom_kills} OOM kills" * bool(result.oom_kills))
                            if x))
    return row, rows


def write_rows(path: Path, rows: list[Any]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))


def campaign(models: dict[str, Path], out: Path, cells: list[ServeCell], *, cap: str, cap_method: str,
             tokens: int, repeats: int, threads: int, ctx: int, python: list[str] | None = None,
             say: Any = print) -> tuple[list[CellRow], list[ClientRow]]:
    """Every cell of every model, interleaved, `repeats` times; the CSVs rewritten after each cell."""
    out.mkdir(parents=True, exist_ok=True)
    cell_rows: list[CellRow] = []
    client_rows: list[ClientRow] = []
    for repeat in range(repeats):
        for label, model in models.items():
            cap_bytes = ramcap.parse_cap(cap, model.stat().st_size)
            for cell in cells:
                cell_ctx = max(ctx, cell.long_prompt + tokens + 64)
                log = out / "servers" / f"{label}-r{repeat}-{cell.label}.log"
                log.parent.mkdir(exist_ok=True)
                row, rows = run_cell(model, label, cell, repeat, cap_bytes=cap_bytes, cap_method=cap_method,
                                     tokens=tokens, threads=threads, ctx=cell_ctx, log=log, python=python)
                cell_rows.append(row)
                client_rows += rows
                say(f"{label} r{repeat} {cell.label}: {row.aggregate_tok_s:.2f} tok/s aggregate, ttft "
                    f"{row.first_ttft_s:.1f}-{row.last_ttft_s:.1f} s, union/summed "
                    f"{row.union_bytes / row.summed_bytes if row.summed_bytes else 0:.2f}, worst gap "
                    f"{max(r.worst_gap_s for r in rows):.2f} s" + (f" ({row.note})" if row.note else ""))
                write_rows(out / "cells.csv", cell_rows)
                write_rows(out / "clients.csv", client_rows)
                (out / "summary.md").write_text(summary(_texts(cell_rows), _texts(client_rows)))
    return cell_rows, client_rows


def _texts(rows: list[Any]) -> list[dict[str, str]]:
    return [{k: str(v) for k, v in asdict(r).items()} for r in rows]


def summary(cells: list[dict[str, str]], clients: list[dict[str, str]]) -> str:
    """The findings table from cells.csv and clients.csv: per model and repeat, each cell against p1-c1 of
    the same repeat (an A/B twin, `p4-c4-lru`, against `p1-c1-lru`; ratios within one run: the machine is
    noisy)."""
    lines = ["| model | repeat | cell | aggregate tok/s | x p1-c1 | per-client tok/s | TTFT first-last s | "
             "union/summed | MB read per decoded token | client 0 worst gap s |", "|---" * 10 + "|"]
    by_run: dict[tuple[str, str], dict[str, dict[str, str]]] = {}
    for c in cells:
        by_run.setdefault((c["model"], c["repeat"]), {})[c["cell"]] = c
    for (model, repeat), run in by_run.items():
        for label, c in run.items():
            twin = "".join("-" + p for p in label.split("-")[2:])   # an A/B twin's suffix: against its own p1-c1
            base = float(run.get("p1-c1" + twin, {}).get("aggregate_tok_s", 0) or 0)
            mine = [r for r in clients if r["model"] == model and r["repeat"] == repeat and r["cell"] == label]
            per = [float(r["decode_tok_s"]) for r in mine if not (int(c["long_prompt"]) and r["client"] == "1")]
            gap = next((float(r["worst_gap_s"]) for r in mine if r["client"] == "0"), 0.0)
            agg = float(c["aggregate_tok_s"])
            share = float(c["union_bytes"]) / float(c["summed_bytes"]) if float(c["summed_bytes"]) else 0.0
            # a client's first token comes from its prompt's step: the decodes are the rest (a step where a
            # client is still in its prompt decodes the others' tokens too: an approximation there)
            decoded = float(c.get("tokens", 0) or 0) - float(c.get("clients", 0) or 0)
            per_token = float(c.get("decode_bytes_read", 0) or 0) / decoded / 1e6 if decoded > 0 else 0.0
            lines.append(f"| {model} | {repeat} | {label} | {agg:.2f} | {agg / base if base else 0:.2f} | "
                         f"{min(per, default=0):.2f}-{max(per, default=0):.2f} | {float(c['first_ttft_s']):.1f}-"
                         f"{float(c['last_ttft_s']):.1f} | {share:.2f} | {per_token:.0f} | {gap:.2f} |")
    return "\n".join(lines) + "\n"
