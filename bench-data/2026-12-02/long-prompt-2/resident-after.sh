#!/usr/bin/env bash
# Issue 29: how much slower a decode after a 2,048-token prompt is with nothing streamed (the model resident,
# uncapped, the same settings): attention over 2,048 more positions in every layer. What the streamed
# cells' "x long-prompt-16" is to be read against. Skewed preset, 2 repeats, 64 answer tokens.
#   MODELS=/tmp/storage-models bench-data/2026-12-02/long-prompt-2/resident-after.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
stream resident-after-2048 -m "$(q3g skewed)" --ram-cap 40% \
  --cells long-prompt-16-resident,long-prompt-2048-resident --long-prompts 16,2048 --tokens 64 --repeats 2 \
  --io-seconds 0
