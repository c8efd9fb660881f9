"""Process and machine facts for the benchmark records, cold starts (dropping a file's pages), and the
small helpers every part of bench shares. Standard library and the engine only: it runs on a board."""

from __future__ import annotations

import contextlib
import csv
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bmoe_edge.engine import info as engine_info
from bmoe_edge.units import MiB

PROMPT = "Once upon a time"
# The long-prompt cells' prompt: this text over and over, cut to the cell's token count (a system prompt, tools
# and a document: what chat clients send before the first answer token).
LONG_TEXT = ("You are a helpful assistant. Answer from the document below and say when it does not say. "
             "The document: the harbour master logs every ship that enters, its cargo, its crew and the hour. ")
PROMPT_LENGTHS = (16, 64, 512, 2048)  # bench stream's long-prompt cells (16: the short prompt they compare to)


def long_prompt(tokenize: Any, n_tokens: int) -> list[int]:
    """`n_tokens` prompt ids: LONG_TEXT repeated (tokenized once, with the BOS) and cut."""
    text = LONG_TEXT
    ids = tokenize(text)
    while len(ids) < n_tokens:
        text += LONG_TEXT
        ids = tokenize(text)
    return ids[:n_tokens]


def drop_page_cache(path: Path) -> None:
    """Write back and drop the file's pages from the page cache (what a cold read starts from)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages (a freshly written file) would not be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def proc_read_bytes() -> int:
    """Bytes this process made the storage layer fetch (/proc/self/io read_bytes)."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def proc_threads() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def mem_info() -> dict[str, int]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            out[key] = int(rest.split()[0]) * 1024
    return out


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def machine_info(path: Path | None = None) -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.lower().startswith(("model name", "hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    info: dict[str, Any] = {
        "hostname": platform.node(), "machine": platform.machine(), "kernel": platform.release(), "cpu": cpu,
        "cores": os.cpu_count(), "mem_total_mb": mem_info().get("MemTotal", 0) // MiB,
        "page_size": os.sysconf("SC_PAGESIZE"),
        "swap_total_mb": mem_info().get("SwapTotal", 0) // MiB, "loadavg": os.getloadavg(),
        "python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if path is not None:
        st = os.stat(path)
        dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        info["device"] = dev
        for key in ("logical_block_size", "read_ahead_kb", "rotational", "scheduler"):
            with contextlib.suppress(OSError), open(f"/sys/dev/block/{dev}/queue/{key}") as f:
                info[f"queue_{key}"] = f.read().strip()
    with contextlib.suppress(Exception):   # the native engine not built or not loading: left out
        v = engine_info.version_info()
        info["llama_pin"] = v.llama_pin
        info["hook"] = v.hook
    return info


def align_down(v: int, a: int) -> int:
    return v - v % a


def align_up(v: int, a: int) -> int:
    return align_down(v + a - 1, a)


def write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def ctx_for(tokens: int) -> int:
    """A context that holds the prompt and `tokens` generated ones."""
    return max(256, align_up(tokens + 64, 256))


