#!/usr/bin/env bash
# Issue 31 (tried, then reverted: findings.md): read-ahead's room in flight lent to the cache while read-ahead auto has it off
# (BudgetPolicy::reading_ahead): margin1.sh's 160-token Gen 2 pair again, `defaults` (the rpi5 profile)
# against the same cache without read-ahead.
#   MODELS=/tmp/storage-models bench-data/2026-12-02/storage-2/room.sh
set -euo pipefail
cd "$(dirname "$0")"
OUT=room-gen2-160 ./long-gen2.sh || echo "gen2 failed"
