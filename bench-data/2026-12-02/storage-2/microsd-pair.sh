#!/usr/bin/env bash
# Issue 31: at the microSD class, `defaults` (this machine's profile: 4 lanes, read-ahead auto) against
# the same cache and lanes with read-ahead off (auto-overlap-od4) and on (auto-overlap-od4-pfauto),
# 4 interleaved repeats: in lanes.sh `defaults` lost 0.81x to auto-overlap-od4 in one of two repeats.
# (A paired cell cannot run at this budget: its two engines' caches would not fit the cap together.)
#   MODELS=/tmp/storage-models bench-data/2026-12-02/storage-2/microsd-pair.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
stream microsd-readahead -m "$(q3g skewed)" --ram-cap 40% --storage microsd \
  --tokens 24 --repeats 4 --cells defaults,auto-overlap-od4,auto-overlap-od4-pfauto --io-seconds 1 \
  --long-prompts ""
