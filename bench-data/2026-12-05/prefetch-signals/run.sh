#!/usr/bin/env bash
# Issue 48's held-out check: `defaults` against one knob turned (--prefetch off, --cache-mb 0, --io-threads 2)
# and against the I/O limit, at a storage class, on both 3 GB presets (uniform routing), 16 and 128 tokens, one
# thread, a 40% cap, the Raspberry Pi 5's profile at every class (a Pi 5 with its connector at Gen 2, forced to
# Gen 3, or from its card slot). Usage: run.sh CLASS TOKENS [REPEATS]   (e.g. run.sh rpi5-nvme-gen2 16 3)
set -euo pipefail
cd "$(dirname "$0")"
class=$1 tokens=$2 repeats=${3:-3}
cells=defaults,defaults-prefetch-off,defaults-cache-0,defaults-io-2
for quant in Q4_0 Q4_K; do
  out=$class-$quant-$tokens
  ../../../.venv/bin/bmoe-edge bench stream -m ~/.cache/bmoe-edge/bench/qwen3-30b-a3b-3g-$quant-skew0.gguf \
    --ram-cap 40% --storage "$class" --board rpi5 --tokens "$tokens" --threads 1 --repeats "$repeats" \
    --cells "$cells" --out "$out" > "$out.log" 2>&1
done
