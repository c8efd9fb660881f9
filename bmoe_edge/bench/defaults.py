"""The engine settings the bench commands take as options, on the settings table's rows
(bmoe_edge.engine.settings, one X-macro row each in native/include/bmoe/config.h).

A bench option is a row's: its flags, its help and its default. Where a bench deliberately runs with another
value than the engine's default, the override is declared here, once, by name and with why; nothing else in
the bench commands writes a setting's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bmoe_edge.engine.settings import BY_NAME, Setting


@dataclass(frozen=True)
class BenchDefault:
    """A settings row as a bench option: the row's default, or an override and why it differs."""

    row: Setting
    value: Any
    why: str = ""   # "" = the row's own default

    @property
    def help(self) -> str:
        """The row's help, and the bench's own default where it differs (typer shows the value)."""
        return f"{self.row.help} Here, unlike a run's default ({self.row.default}): {self.why}" if self.why \
            else self.row.help


def row(name: str) -> BenchDefault:
    """The row `name` with its own default."""
    return BenchDefault(BY_NAME[name], BY_NAME[name].default)


def override(name: str, value: Any, why: str) -> BenchDefault:
    """The row `name` with a bench's own default `value` (checked by the row)."""
    return BenchDefault(BY_NAME[name], BY_NAME[name].check(value), why)


# `bench stream`'s cells, `bench serve`'s servers and `bench rpc`'s main process and workers: one compute
# thread, not auto (every core, one left to the read lanes), so a cell measures its read path, cache and
# server rather than the machine's core count, and campaigns on different machines compare.
THREADS = override("threads", 1, "one thread, so cells compare across machines and runs.")
# `bench serve`'s sequences: a short context is enough for its short prompts (a gap cell's server gets room
# for its long prompt on top), and it keeps the KV cache small beside the capped expert cache.
SERVE_CTX = override("ctx", 512, "each sequence's context; a gap cell adds room for its long prompt.")
# `bench serve`'s servers chunk prompts as `serve` does.
PREFILL_CHUNK = row("prefill_chunk")
