#!/usr/bin/env bash
# Issue 29, after llama.cpp patch 0012 (ggml-cpu frees a work buffer of 32 MiB or more after its graph: a
# 2,048-token prompt's 96 MiB had stayed resident through the answer): decode after a 2,048-token prompt
# against after 16 tokens, same settings, 40% cap, 2 repeats, 64 answer tokens; both presets on this VM's
# drive, the skewed one at the Pi 5 Gen 2 class too (quiet.sh's runs are the before).
#   MODELS=/tmp/storage-models bench-data/2026-12-02/long-prompt-2/work-buffer.sh
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
run() {  # preset, storage (native or a class), out
  stream "$3" -m "$(q3g "$1")" --ram-cap 40% --storage "$2" \
    --cells long-prompt-16,long-prompt-2048 --long-prompts 16,2048 --tokens 64 --repeats 2 --io-seconds 1
}
run skewed native wb-skewed-native-2048
run uniform native wb-uniform-native-2048
run skewed rpi5-nvme-gen2 wb-skewed-gen2-2048
