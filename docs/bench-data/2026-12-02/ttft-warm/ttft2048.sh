#!/usr/bin/env bash
# Issue 29: time to first token of a 2,048-token prompt at the Pi 5 NVMe Gen 2 class against the same prompt
# resident (uncapped, same settings), uniform preset, 40% cap, 2 repeats: ttft512.sh at 2,048 tokens
# with the pool warmed before the prompt (serve's idle steps) and trimmed to the budget, not to nothing.
#   MODELS=/tmp/storage-models docs/bench-data/2026-12-02/ttft-warm/ttft2048.sh
set -euo pipefail
cd "$(dirname "$0")"
BMOE=${BMOE:-../../../../.venv/bin/bmoe-edge}
MODELS=${MODELS:-/tmp/storage-models}
$BMOE bench stream -m "$MODELS/q3g-uniform.gguf" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --cells long-prompt-2048,long-prompt-2048-resident --long-prompts 2048 --tokens 16 --repeats 2 --io-seconds 1 \
  --out ttft-uniform-gen2-2048 > ttft-uniform-gen2-2048.log 2>&1 || echo "ttft failed"
