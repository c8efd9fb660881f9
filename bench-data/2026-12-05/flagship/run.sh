#!/usr/bin/env bash
# Issue 48: the flagship's shape re-measured on today's code (2026-12-01's flagship.sh, before the frequency
# cache, the pool trim, the two-lane Pi profile, the repacked kernels and read-ahead from the drive's signals).
# Qwen3-30B-A3B's dimensions (48 layers, 128 experts, top-8, d 2048, expert FF 768; 17.0 GB in Q4_K), skewed
# routing, an 8 GB Pi 5's budget (6.5 GB cap), the rpi5 profile (the board of the storage class), one thread,
# at the Pi 5 NVMe Gen 2 and Gen 3 classes, 2 repeats. `defaults` against its I/O bound (summary.md, "At the
# storage class") and against --prefetch off.
#   bench-data/2026-12-05/flagship/run.sh [MODEL]   (default /tmp/storage-models/flag-17g-skewed.gguf, made
#   by `bmoe-edge tiny-model --preset qwen3-30b-a3b-17g --quant Q4_K --routing-skew 0.8 -o MODEL`)
set -euo pipefail
cd "$(dirname "$0")"
model=${1:-/tmp/storage-models/flag-17g-skewed.gguf}
for class in ${CLASSES:-rpi5-nvme-gen2 rpi5-nvme-gen3}; do
  ../../../.venv/bin/bmoe-edge bench stream -m "$model" --ram-cap 6.5GB --storage "$class" --tokens 32 \
    --threads 1 --repeats 2 --cells defaults,defaults-prefetch-off,storage-check --board rpi5 --out "$class" \
    > "$class.log" 2>&1
done
