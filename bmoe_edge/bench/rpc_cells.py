"""The RPC bench cells: a model bigger than any one participant's RAM cap, run by a main process that
streams (its own cgroup, the cap) with 0, 1 or 2 rpc-server workers (each in a cgroup of its own at
the same cap, reporting it with --mem-mb so the layers are placed by it). Records tok/s and the
bytes over the network per token beside the worker caps' peaks.

    bmoe-edge bench rpc -m MODEL --ram-cap 40% --workers 0,1,2   (docs/rpc.md; not run in CI)
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from bmoe_edge.bench.cells import BenchCell, spawn_cell
from bmoe_edge.bench.defaults import THREADS
from bmoe_edge.bench.ramcap import CapResult, MemCap, make_cap
from bmoe_edge.engine import rpc_worker
from bmoe_edge.units import MiB


@contextlib.contextmanager
def capped_workers(n: int, cap_bytes: int, cap_method: str, threads: int,
                   log_dir: Path) -> Iterator[tuple[list[rpc_worker.LocalWorker], list[CapResult]]]:
    """`n` rpc-servers on loopback, each in its own memory cgroup of `cap_bytes`, reporting that much.
    The second list is filled when the block ends: each worker cap's peak and OOM counts."""
    workers: list[rpc_worker.LocalWorker] = []
    caps: list[MemCap] = []
    results: list[CapResult] = []
    try:
        for _ in range(n):
            cap = make_cap(cap_bytes, cap_method)
            cap.prepare()
            caps.append(cap)
            port = rpc_worker.free_port()
            argv = rpc_worker.command(port, "127.0.0.1", threads, cap_bytes // MiB)
            out = open(log_dir / f"rpc-worker-{port}.log", "ab")  # noqa: SIM115 - closed with the process
            proc = subprocess.Popen(argv, stdout=out, stderr=out, preexec_fn=cap.preexec)
            workers.append(rpc_worker.LocalWorker(rpc_worker.Endpoint("127.0.0.1", port), proc))
        for w in workers:
            rpc_worker.wait_ready(w)
        yield workers, results
    finally:
        for w in workers:
            rpc_worker.stop_worker(w)
        results.extend(cap.finish() for cap in caps)


def rpc_cell(stream_cell: BenchCell, n_workers: int, endpoints: str) -> BenchCell:
    """The streaming cell with `n_workers` workers: whole layers placed by the memory they report."""
    label = f"{stream_cell.label}+rpc{n_workers}" if n_workers else stream_cell.label
    config = {**stream_cell.config, "rpc": endpoints} if n_workers else stream_cell.config
    return replace(stream_cell, label=label, config=config, group="rpc" if n_workers else stream_cell.group)


def run_rpc_cells(stream_cell: BenchCell, model: Path, cap_bytes: int, workers: list[int], out: Path,
                  cap_method: str = "auto", threads: int = THREADS.value,
                  timeout: float = 3600) -> list[dict[str, Any]]:
    """One record per worker count: the main cell's (tok/s, net_bytes_per_token, its cap's peak) and each
    worker cap's peak usage."""
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for n in workers:
        with capped_workers(n, cap_bytes, cap_method, threads, out) as (ws, caps):
            cell = rpc_cell(stream_cell, n, rpc_worker.endpoints(ws))
            record = spawn_cell(cell, model, make_cap(cap_bytes, cap_method), out / f"{cell.label}.tokens.csv",
                                timeout)
        record["workers"] = n
        record["worker_cap_peaks_mb"] = [round(c.max_usage_bytes / MiB, 1) for c in caps]
        record["worker_oom_kills"] = sum(c.oom_kills for c in caps)
        records.append(record)
    return records
