"""Byte sizes: the binary units, and the one way a size is shown to people (foundation: every stage
may use it)."""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20


def size_text(n: float) -> str:
    """`1.7 MiB`, `648 KiB`, `512 B`."""
    if n >= MiB:
        return f"{n / MiB:.1f} MiB"
    return f"{n / KiB:.0f} KiB" if n >= KiB else f"{n:.0f} B"
