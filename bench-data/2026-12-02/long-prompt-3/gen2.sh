#!/usr/bin/env bash
# Issue 29, after the page pool's trim splits the huge pages it frees part of: decode after a 2,048-token
# prompt against after 16 tokens, same settings, 40% cap, at the Pi 5 NVMe Gen 2 class (where a decode is
# I/O-bound, so the ratio is readable), both presets, 2 repeats, 64 answer tokens. The before is
# ../long-prompt-2/work-buffer.sh's wb-skewed-gen2-2048 (same cells and settings).
#   MODELS=/tmp/storage-models [PREFIX=gen2] [PRESETS="skewed uniform"] bench-data/2026-12-02/long-prompt-3/gen2.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
for preset in ${PRESETS:-skewed uniform}; do
  out=${PREFIX:-gen2}-$preset-2048
  stream "$out" -m "$(q3g "$preset")" --ram-cap 40% --storage rpi5-nvme-gen2 \
    --cells long-prompt-16,long-prompt-2048 --long-prompts 16,2048 --tokens 64 --repeats 2 --io-seconds 1
done
