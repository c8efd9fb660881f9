#!/usr/bin/env bash
# Issue 31, after read-ahead auto's margin went from 3% to 1% (kOffMargin): the 160-token Gen 2 pair of
# long-gen2.sh again (`defaults`, the rpi5 profile, against the same cache without read-ahead), and on this
# VM's unthrottled drive, where reading ahead pays, `auto` paired token by token with `predict` and with no
# read-ahead (the prefetch-paired cells, 200 tokens: the first probe, its stretch, and the second probe).
#   MODELS=/tmp/storage-models bench-data/2026-12-02/storage-2/margin1.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
OUT=margin1-gen2-160 ./long-gen2.sh || echo "gen2 failed"
stream margin1-native-paired -m "$(q3g skewed)" --ram-cap 40% \
  --tokens 200 --repeats 2 --cells pfauto-paired-predict,pfauto-paired-off --io-seconds 1 --long-prompts ""
