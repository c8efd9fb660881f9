"""A finished campaign's results written into its directory: summary.md, targets.json and the plots."""

from __future__ import annotations

import json
from pathlib import Path

from bmoe_edge.bench.plots import plots
from bmoe_edge.bench.summary import summary_markdown, targets


def write_summary(out: Path, with_plots: bool = True) -> Path:
    text = summary_markdown(out)
    (out / "summary.md").write_text(text)
    (out / "targets.json").write_text(json.dumps(targets(out), indent=2) + "\n")
    if with_plots:
        plots(out)
    return out / "summary.md"
