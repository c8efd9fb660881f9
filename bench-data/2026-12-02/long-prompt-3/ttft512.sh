#!/usr/bin/env bash
# Issue 29: time to first token of a 512-token prompt at the Pi 5 NVMe Gen 2 class against the same prompt
# resident (uncapped, same settings), uniform preset, 40% cap, 2 repeats: ../long-prompt-2/quiet.sh's cells
# after the pool's split trim and per-sequence counts.
#   MODELS=/tmp/storage-models bench-data/2026-12-02/long-prompt-3/ttft512.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
stream ttft-uniform-gen2-512 -m "$(q3g uniform)" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --cells long-prompt-512,long-prompt-512-resident --long-prompts 512 --tokens 16 --repeats 2 --io-seconds 1
