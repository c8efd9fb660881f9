#!/usr/bin/env bash
# Issue 29: time to first token of a 512-token prompt at the Pi 5 NVMe Gen 2 class against the same prompt
# resident (uncapped, same settings), uniform preset, 40% cap, 2 repeats: ../long-prompt-2/quiet.sh's cells
# after the pool's split trim and per-sequence counts.
#   MODELS=/tmp/storage-models docs/bench-data/2026-12-02/long-prompt-3/ttft512.sh
set -euo pipefail
cd "$(dirname "$0")"
BMOE=${BMOE:-../../../../.venv/bin/bmoe-edge}
MODELS=${MODELS:-/tmp/storage-models}
$BMOE bench stream -m "$MODELS/q3g-uniform.gguf" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --cells long-prompt-512,long-prompt-512-resident --long-prompts 512 --tokens 16 --repeats 2 --io-seconds 1 \
  --out ttft-uniform-gen2-512 > ttft-uniform-gen2-512.log 2>&1 || echo "ttft failed"
