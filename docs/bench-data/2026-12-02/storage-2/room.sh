#!/usr/bin/env bash
# Issue 31 (tried, then reverted: findings.md): read-ahead's room in flight lent to the cache while read-ahead auto has it off
# (BudgetPolicy::reading_ahead): margin1.sh's 160-token Gen 2 pair again, `defaults` (the rpi5 profile)
# against the same cache without read-ahead.
#   MODELS=/tmp/storage-models docs/bench-data/2026-12-02/storage-2/room.sh
set -euo pipefail
cd "$(dirname "$0")"
BMOE=${BMOE:-../../../../.venv/bin/bmoe-edge}
MODELS=${MODELS:-/tmp/storage-models}
$BMOE bench stream -m "$MODELS/q3g-skewed.gguf" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --tokens 160 --repeats 2 --cells defaults,auto-overlap-od2 --io-seconds 1 --long-prompts "" \
  --out room-gen2-160 > room-gen2-160.log 2>&1 || echo "gen2 failed"
