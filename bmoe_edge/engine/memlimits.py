"""The memory limits that apply to this process: every memory cgroup it is in (v2 and v1, with their
ancestors) and the machine's pressure. `tune` reports them, `rpc-worker` reports the tightest to the
main board; the engine reads the same in C++ (native/src/policy/memory_budget.cpp). Standard library only."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from bmoe_edge.units import MiB

UNLIMITED = 1 << 60         # cgroup "max" / v1's 2^63 - page


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


def tightest_limit() -> MemoryLimit | None:
    """The smallest cgroup limit of this process, None where only the machine's RAM bounds it."""
    return min(memory_limits(), key=lambda limit: limit.mb, default=None)


def release_free_heap() -> bool:
    """Give the heap's free memory back to the system (glibc's malloc_trim: every arena, free pages inside them
    too). An answer's temporaries — a grammar sampler's tables, a template's rendering, a schema's conversion,
    on whichever thread made them — stay mapped in their thread's arena after they are freed, so a server's
    RSS rose with the arenas' high-water marks (1.3-1.4x over 5,000 fuzz requests) and the expert cache, sized
    from the memory really there, lost what they held. False where the C library has no malloc_trim."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
