"""A finished campaign's results written into its directory: summary.md, targets.json and the plots."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from bmoe_edge.bench.plots import plots
from bmoe_edge.bench.summary import summary_markdown, targets


def write_summary(out: Path, with_plots: bool = True) -> Path:
    """summary.md, targets.json and the plots: where matplotlib is (a board's bundle has none, and
    `bench stream --host` draws them here from the fetched CSVs)."""
    text = summary_markdown(out)
    (out / "summary.md").write_text(text)
    (out / "targets.json").write_text(json.dumps(targets(out), indent=2) + "\n")
    if with_plots and importlib.util.find_spec("matplotlib") is not None:
        plots(out)
    return out / "summary.md"
