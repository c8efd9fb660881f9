"""systemd unit files a deploy writes: text escaped for a unit, the memory limit, the job unit."""

from __future__ import annotations

from bmoe_edge.errors import BmoeError

JOB_RUNTIME_MAX = "6h"    # the systemd job unit's RuntimeMaxSec


def systemd_escape(text: str) -> str:
    """Text for inside a double-quoted word of a unit file: specifiers, variables, quotes escaped."""
    if "\n" in text or "\0" in text:
        raise BmoeError(f"{text!r} cannot be written into a systemd unit")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")


def memory_max(ram_mb: int) -> str:
    """The job unit's MemoryMax: the board's RAM less what the OS keeps (an eighth, 256 MiB to 1 GiB)."""
    return f"{max(64, ram_mb - min(1024, max(256, ram_mb // 8)))}M"


def render_job_unit(template: str, install_dir: str, user: str, *, ram_mb: int = 4096,
                    runtime_max: str = JOB_RUNTIME_MAX) -> str:
    """The release's `bmoe-edge-generate@.service` template with the install dir, user and limits."""
    return (template.replace("@INSTALL_DIR@", systemd_escape(install_dir)).replace("@USER@", systemd_escape(user))
            .replace("@MEMORY_MAX@", memory_max(ram_mb)).replace("@RUNTIME_MAX@", runtime_max))
