"""Issue 29: where a 512-token prompt's time goes at the Pi 5 Gen 2 class beyond the resident prefill
(quiet-uniform-gen2-512: streamed TTFT 11.3-12.3 s, resident 8.5-8.9 s, stalls 0.16-0.28 s). The
long-prompt-512 cell's settings, one knob changed at a time, each a fresh capped, throttled process:
lanes, overlap, the cap. Uniform preset, 40% cap, 2 repeats, interleaved.

    .venv/bin/python bench-data/2026-12-02/long-prompt-2/ttft_parts.py /tmp/storage-models/q3g-uniform.gguf
"""
import json
import sys
from pathlib import Path

from bmoe_edge.bench.cells import BenchCell, spawn_cell
from bmoe_edge.bench.ramcap import make_cap
from bmoe_edge.bench.storage import read_limit
from bmoe_edge.cli.bench import _long_prompt_configs, storage_targets

model = Path(sys.argv[1])
cap = int(model.stat().st_size * 0.4)
limit = read_limit(storage_targets()["rpi5-nvme-gen2"], model)
base = _long_prompt_configs(8, None, [512])[512]
variants = {
    "as-is": ({}, True),
    "lanes-1": ({"io_threads": 1}, True),
    "lanes-2": ({"io_threads": 2}, True),
    "serial": ({"overlap": False}, True),
    "uncapped": ({}, False),
    "resident": ({"stream": False}, False),
}
out = Path(__file__).with_name("ttft-parts.jsonl")
with open(out, "w") as f:
    for rep in range(2):
        for name, (change, capped) in variants.items():
            cell = BenchCell(f"ttft-{name}", "resident" if name == "resident" else "stream", {**base, **change},
                             capped=capped, tokens=8, prompt_tokens=512)
            rec = spawn_cell(cell, model, make_cap(cap if capped else 0, "auto", limit), None, 600)
            keep = {k: rec.get(k) for k in ("label", "status", "ttft_ms", "prompt_ms", "prefill_bytes", "threads",
                                             "io_threads", "overlap", "cap_max_usage_mb", "cap_failcnt", "loadavg_before")}
            keep["repeat"] = rep
            print(json.dumps(keep), flush=True)
            f.write(json.dumps(keep) + "\n")
