#!/usr/bin/env bash
# Issue 31: the 24-token cells of quiet.sh end inside read-ahead auto's first probe (4 windows of 8
# decodes), so `defaults` there is 2/3 read-ahead whatever the policy would choose. 160 tokens: the
# probe, its choice, and a stretch of it; `defaults` (the rpi5 profile: 2 lanes, auto) against the
# same cache at 2 lanes without read-ahead, at the Pi 5 Gen 2 class, 2 repeats.
#   MODELS=/tmp/storage-models bench-data/2026-12-02/storage-2/long-gen2.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
OUT=${OUT:-quiet-gen2-160}  # margin1.sh and room.sh run this pair again into their own folders
stream "$OUT" -m "$(q3g skewed)" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --tokens 160 --repeats 2 --cells defaults,auto-overlap-od2 --io-seconds 1 --long-prompts ""
