"""The long-prompt cells at a larger physical batch (issue 29, item 2: each routed expert read once per
prompt): `long-prompt-N` as `bench stream` runs it (what `generate` picks: ubatch 512) beside the same cell
with the whole prompt in one ubatch (`-ubN`), under the same cap, one campaign (interleaved).

usage: ubatch_cells.py MODEL CAP OUT [--resident] [--no-ubatch] [N ...]

--resident adds `resident-N`: the same settings, not streamed, no cap (what the model itself costs after a
prompt of N tokens: attention over a longer context is compute streaming cannot save). --no-ubatch leaves
the one-ubatch cells out.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bmoe_edge.bench import campaign, layout, ramcap, results
from bmoe_edge.bench.cells import BenchCell
from bmoe_edge.cli.bench import _machine_defaults


def main() -> None:
    model, cap_text, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    flags = {a for a in sys.argv[4:] if a.startswith("--")}
    lengths = [int(x) for x in sys.argv[4:] if not x.startswith("--")] or [16, 2048]
    lay = layout.gguf_layout(model)
    cap = ramcap.parse_cap(cap_text, lay.file_bytes)
    cells = []
    for n in lengths:
        config = _machine_defaults(64, n)
        cells.append(BenchCell(f"long-prompt-{n}", "stream", dict(config), tokens=64, group="stream", prompt_tokens=n))
        if "--resident" in flags:
            cells.append(BenchCell(f"resident-{n}", "resident", dict(config, stream=False), capped=False, tokens=64,
                                   group="resident", prompt_tokens=n))
        if n > int(config["ubatch"]) and "--no-ubatch" not in flags:
            one = dict(config, batch=n, ubatch=n)
            cells.append(BenchCell(f"long-prompt-{n}-ub{n}", "stream", one, tokens=64, group="stream",
                                   prompt_tokens=n))
    campaign.stream_campaign(campaign.Campaign(model, out, cap, "auto", cells, 1, io_seconds=0))
    print(results.write_summary(out).read_text())


if __name__ == "__main__":
    main()
