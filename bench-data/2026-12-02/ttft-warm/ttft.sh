#!/usr/bin/env bash
# Issue 29: time to first token of an N-token prompt at the Pi 5 NVMe Gen 2 class against the same prompt
# resident (uncapped, same settings), the uniform preset (PRESET=skewed: the other), 40% cap: ../long-prompt-3/ttft512.sh's cells with the pool
# warmed before the prompt (serve's idle steps) and trimmed to the budget, not to nothing. Run as
#   MODELS=/tmp/storage-models bench-data/2026-12-02/ttft-warm/ttft.sh 512 3    (ttft-uniform-gen2-512)
#   MODELS=/tmp/storage-models bench-data/2026-12-02/ttft-warm/ttft.sh 2048 2   (ttft-uniform-gen2-2048)
#   PRESET=skewed MODELS=/tmp/storage-models bench-data/2026-12-02/ttft-warm/ttft.sh 512 3
set -euo pipefail
cd "$(dirname "$0")" && . ../../campaign.sh
n=${1:?prompt tokens}
repeats=${2:-3}
preset=${PRESET:-uniform}
stream "ttft-$preset-gen2-$n" -m "$(q3g "$preset")" --ram-cap 40% --storage rpi5-nvme-gen2 \
  --cells "long-prompt-$n,long-prompt-$n-resident" --long-prompts "$n" --tokens 16 --repeats "$repeats" \
  --io-seconds 1
