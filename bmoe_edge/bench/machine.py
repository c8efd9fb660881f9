"""Process and machine facts for the benchmark records, cold starts (dropping a file's pages), and the
small helpers every part of bench shares. Standard library and the engine only: it runs on a board."""

from __future__ import annotations

import contextlib
import csv
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1 << 20
UNLIMITED = 1 << 60         # cgroup "max" / v1's 2^63 - page
PROMPT = "Once upon a time"


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
    with contextlib.suppress(Exception):
        from bmoe_edge.engine import info as engine_info

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


def size_text(n: int) -> str:
    return f"{n / MiB:g} MiB" if n >= MiB else f"{n / 1024:g} KiB" if n >= 1024 else f"{n} B"


def ctx_for(tokens: int) -> int:
    """A context that holds the prompt and `tokens` generated ones."""
    return max(256, align_up(tokens + 64, 256))


# ---------------------------------------------------------------------------------------------------
# The memory limits that apply to this process (what `tune` reports; the engine reads the same in C++).


@dataclass(frozen=True)
class MemoryLimit:
    source: str     # e.g. "cgroup v2 /sys/fs/cgroup/user.slice memory.max"
    mb: int


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit():
        return None
    value = int(text)
    return value if value < UNLIMITED else None


def _mounts() -> list[tuple[str, str, str, list[str]]]:
    """(root, mount point, fs type, super options) of every mount, from /proc/self/mountinfo."""
    out = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if "-" not in parts:
                continue
            sep = parts.index("-")
            out.append((parts[3], parts[4], parts[sep + 1], parts[sep + 3].split(",") if len(parts) > sep + 3 else []))
    return out


def _ancestors(mount: str, root: str, cgroup: str) -> list[Path]:
    """The cgroup's directory under its mount and every ancestor up to the mount, innermost first."""
    rel = cgroup[len(root):] if root != "/" and cgroup.startswith(root) else cgroup
    parts = [p for p in rel.split("/") if p]
    return [Path(mount, *parts[:i]) for i in range(len(parts), -1, -1)]


def memory_limits() -> tuple[MemoryLimit, ...]:
    """Every memory limit of the cgroups this process is in, v2 and v1, with their ancestors."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return ()
    v2 = v1 = None
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if hid == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    found: list[MemoryLimit] = []
    for root, mount, fstype, options in _mounts():
        if fstype == "cgroup2" and v2 is not None:
            for d in _ancestors(mount, root, v2):
                for name in ("memory.max", "memory.high"):
                    value = _read_limit(d / name)
                    if value is not None:
                        found.append(MemoryLimit(f"cgroup v2 {d} {name}", value // MiB))
        elif fstype == "cgroup" and "memory" in options and v1 is not None:
            for d in _ancestors(mount, root, v1):
                value = _read_limit(d / "memory.limit_in_bytes")
                if value is not None:
                    found.append(MemoryLimit(f"cgroup v1 {d} memory.limit_in_bytes", value // MiB))
    return tuple(dict.fromkeys(found))


def memory_pressure() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/pressure/memory").read_text().splitlines():
            if line.startswith("some "):
                return float(line.split()[1].partition("=")[2])
    return None
