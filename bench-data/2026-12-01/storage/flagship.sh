#!/usr/bin/env bash
# Issue 31 item 4: the flagship's shape measured. Qwen3-30B-A3B's dimensions (qwen3-30b-a3b-17g: 48
# layers, 128 experts, top-8, d 2048, expert FF 768; 17.0 GB in Q4_K), skewed routing, under an 8 GB
# Pi 5's budget (6.5 GiB cap), at the Pi 5 NVMe Gen 2 and Gen 3 classes, 2 repeats. No resident cell: 17 GB
# resident does not fit beside five other engineers on this 24 GiB machine; the compute bound is the
# cells' own compute time per token.
#   MODELS=/tmp/storage-models bench-data/2026-12-01/storage/flagship.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
flagship=$(model "$MODELS/flag-17g-skewed.gguf" --preset qwen3-30b-a3b-17g --quant Q4_K --routing-skew 0.8)
for class in rpi5-nvme-gen2 rpi5-nvme-gen3; do
  stream "flagship-$class" -m "$flagship" --ram-cap 6.5GB --storage "$class" --tokens 32 --mmap-tokens 4 \
    --repeats 2 --cells defaults,auto-overlap-od2,off-overlap-od4,mmap,storage-check
done
