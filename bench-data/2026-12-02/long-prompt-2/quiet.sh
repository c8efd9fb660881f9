#!/usr/bin/env bash
# Issue 29 on a quiet machine (nobody else's builds or benchmarks; the loaded runs beside this script's
# logs had load 6-13): the 512-token time to first token against its bound at the Pi 5 Gen 2 class
# (uniform preset), and decode after a 2,048-token prompt against after 16 tokens, same settings, skewed
# preset, at Gen 2 and on this VM's unthrottled drive. 40% cap, 2 repeats, 64 answer tokens.
#   MODELS=/tmp/storage-models bench-data/2026-12-02/long-prompt-2/quiet.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
stream quiet-uniform-gen2-512 -m "$(q3g uniform)" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --cells storage-check,long-prompt-16,long-prompt-512,long-prompt-512-resident --long-prompts 16,512 \
  --tokens 64 --repeats 2
stream quiet-skewed-gen2-2048 -m "$(q3g skewed)" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --cells long-prompt-16,long-prompt-2048 --long-prompts 16,2048 \
  --tokens 64 --repeats 2
stream quiet-skewed-native-2048 -m "$(q3g skewed)" --ram-cap 40% \
  --cells long-prompt-16,long-prompt-2048 --long-prompts 16,2048 \
  --tokens 64 --repeats 2
