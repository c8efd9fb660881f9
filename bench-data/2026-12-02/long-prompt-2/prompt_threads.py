"""A prompt on every core or on the decode's threads (issue 29: time to first token at the Pi 5 Gen 2 class):
`long-prompt-N` as `bench stream` runs it (threads auto: a prompt's batch on every core, a decode's on all
but one) beside `long-prompt-N-t1` (--threads 1: the prompt on one core, as before), and the resident
prefill (threads auto: every core), under the same cap and storage throttle, one campaign (interleaved).

usage: prompt_threads.py MODEL CAP OUT STORAGE REPEATS [N ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from bmoe_edge.bench import campaign, layout, ramcap, results
from bmoe_edge.bench import storage as storage_classes
from bmoe_edge.bench.cells import BenchCell
from bmoe_edge.cli.bench import _machine_defaults, storage_targets


def main() -> None:
    model, cap_text, out, storage = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    repeats = int(sys.argv[5])
    lengths = [int(x) for x in sys.argv[6:]] or [512]
    target = storage_classes.parse_storage(storage, storage_targets())  # type: ignore[arg-type]
    lay = layout.gguf_layout(model)
    cap = ramcap.parse_cap(cap_text, lay.file_bytes)
    cells = []
    for n in lengths:
        config = _machine_defaults(64, target.board if target else None, max(lengths))
        cells.append(BenchCell(f"long-prompt-{n}", "stream", dict(config), tokens=16, group="stream", prompt_tokens=n))
        cells.append(BenchCell(f"long-prompt-{n}-t1", "stream", dict(config, threads=1), tokens=16, group="stream",
                               prompt_tokens=n))
        cells.append(BenchCell(f"long-prompt-{n}-resident", "resident", dict(config, stream=False), capped=False,
                               tokens=2, warmup=1, group="resident", prompt_tokens=n))
    campaign.stream_campaign(campaign.Campaign(model, out, cap, "auto", cells, repeats, io_seconds=0, storage=target))
    print(results.write_summary(out).read_text())


if __name__ == "__main__":
    main()
